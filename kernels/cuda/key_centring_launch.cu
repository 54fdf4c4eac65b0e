// GPU launch of key centring (body and math in key_centring_kernels.cuh, API
// in key_centring.h): a grid of (cluster, B * Hkv) blocks in clusters of
// (cluster, 1, 1), kCentringSmemBytes of dynamic shared memory a block, the
// instantiation for the element type and path. The CPU emulation defines the
// same launcher over its block runner (tests/cuda/key_centring_test.cpp).
// Build: target gaugewatch_cuda (sm_90a).

#include <atomic>
#include <cstdint>
#include <mutex>

#include "kernels/cuda/key_centring_kernels.cuh"

namespace gaugewatch::gpu::detail {

namespace {

// The shared-memory limit of every instantiation raised once per device (the
// attribute is per device; setting it costs host time on every call otherwise).
cudaError_t allow_centring_smem() {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  static std::atomic<uint64_t> ready{0};  // bit per device id < 64
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (ready.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  const CentringKernel kernels[] = {
      &centring_kernel<CentringBf16, true>, &centring_kernel<CentringBf16, false>,
      &centring_kernel<CentringFp16, true>, &centring_kernel<CentringFp16, false>,
      &centring_kernel<CentringFp32, true>, &centring_kernel<CentringFp32, false>,
  };
  for (const CentringKernel kernel : kernels) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kCentringSmemBytes));
    if (err != cudaSuccess) return err;
  }
  ready.fetch_or(bit, std::memory_order_release);
  return cudaSuccess;
}

}  // namespace

cudaError_t launch_centring(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t stream) {
  if (kv_heads_total == 0) return cudaSuccess;
  cudaError_t err = allow_centring_smem();
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(args.cluster), static_cast<unsigned>(kv_heads_total));
  config.blockDim = dim3(kCentringThreads);
  config.dynamicSmemBytes = static_cast<size_t>(kCentringSmemBytes);
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(args.cluster);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  err = cudaLaunchKernelEx(&config, centring_kernel_for(args), args);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace gaugewatch::gpu::detail
