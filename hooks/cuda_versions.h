#pragma once
// Versions for the agent's Hello. CUDA builds: the CUDA runtime's version and
// the CUDA version the installed driver supports ("13.0"), when a driver is
// there; "" without one (a CPU machine) and in CPU-only builds. Neither call
// creates a CUDA context or initializes the driver (safe before a fork).

#include <string>

namespace gaugewatch::hooks {

std::string cuda_driver_version();
std::string cuda_runtime_version();

}  // namespace gaugewatch::hooks
