#include "hooks/cuda_versions.h"

#if defined(GAUGEWATCH_HOOKS_CUDA)
#include <cuda_runtime_api.h>
#endif

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

}  // namespace gaugewatch::hooks
