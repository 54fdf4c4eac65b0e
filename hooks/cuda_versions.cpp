#include "hooks/cuda_versions.h"

#if defined(GAUGEWATCH_HOOKS_CUDA)
#include <cuda_runtime_api.h>
#endif

#include <cstdio>

#include "hooks/runtime.h"

namespace gaugewatch::hooks {
namespace {

int cuda_driver_number() {
#if defined(GAUGEWATCH_HOOKS_CUDA)
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return version;
#else
  return 0;
#endif
}

}  // namespace

std::string cuda_driver_version() { return format_cuda_version(cuda_driver_number()); }

std::string cuda_runtime_version() {
#if defined(GAUGEWATCH_HOOKS_CUDA)
  if (cuda_driver_number() <= 0) return "";
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return format_cuda_version(version);
#else
  return "";
#endif
}

GpuIdentity current_gpu_identity() {
  GpuIdentity id;
#if defined(GAUGEWATCH_HOOKS_CUDA)
  int device = -1;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return id;
  }
  const auto* b = reinterpret_cast<const unsigned char*>(prop.uuid.bytes);
  char uuid[64];
  std::snprintf(uuid, sizeof uuid, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  id.uuid = uuid;
  // cudaDeviceGetPCIBusId gives "0000:19:00.0"; DCGM and nvidia-smi spell the domain with 8 digits.
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, device) == cudaSuccess) {
    unsigned domain = 0, bus_number = 0, slot = 0, function = 0;
    if (std::sscanf(bus, "%x:%x:%x.%x", &domain, &bus_number, &slot, &function) == 4) {
      char dcgm[32];
      std::snprintf(dcgm, sizeof dcgm, "%08X:%02X:%02X.%X", domain, bus_number, slot, function);
      id.pci_bus_id = dcgm;
    }
  } else {
    (void)cudaGetLastError();
  }
#endif
  return id;
}

}  // namespace gaugewatch::hooks
