#pragma once
// Versions for the agent's Hello. CUDA builds: the CUDA runtime's version and
// the CUDA version the installed driver supports ("13.0"), when a driver is
// there; "" without one (a CPU machine) and in CPU-only builds. Neither call
// creates a CUDA context or initializes the driver (safe before a fork).

#include <string>

namespace gaugewatch::hooks {

std::string cuda_driver_version();
std::string cuda_runtime_version();

// The current CUDA device as nvidia-smi and DCGM name it, for the agent's
// rank info (joined with dcgm-exporter's series on UUID): uuid
// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", pci_bus_id "00000000:19:00.0"
// (8-digit domain). Empty strings where there is no device or no CUDA build.
// Called at the first CUDA attention call, when the trainer's context exists.
struct GpuIdentity {
  std::string uuid, pci_bus_id;
};
GpuIdentity current_gpu_identity();

}  // namespace gaugewatch::hooks
