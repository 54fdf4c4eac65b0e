// GPU launch of key centring (bodies and cost in key_centring_kernels.cuh,
// API and math in key_centring.h): kernel 1 (sums, where something may be
// centred) on a grid of (cluster, B * Hkv) blocks in clusters of (cluster, 1,
// 1), then kernel 2 (apply) on (apply_blocks, B * Hkv), on one stream, no
// workspace (kernel 2 reads kbar back from the op's output). Both fit the
// default 48 KiB of dynamic shared memory, so no attribute is set. The CPU
// emulation defines the same launcher over its block runner
// (tests/cuda/key_centring_test.cpp).
// Build: target gaugewatch_cuda (sm_90a).

#include <cstdint>

#include "kernels/cuda/key_centring_kernels.cuh"

namespace gaugewatch::gpu::detail {

static_assert(kCentringSumSmemBytes <= 48 * 1024 && kCentringApplySmemBytes <= 48 * 1024,
              "key centring's kernels use the default dynamic shared memory limit");

cudaError_t launch_centring(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t stream) {
  if (kv_heads_total == 0) return cudaSuccess;
  const CentringKernels kernels = centring_kernels_for(args);
  cudaError_t err = cudaSuccess;
  if (args.sums != 0) {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(args.cluster), static_cast<unsigned>(kv_heads_total));
    config.blockDim = dim3(kCentringSumThreads);
    config.dynamicSmemBytes = static_cast<size_t>(kCentringSumSmemBytes);
    config.stream = stream;
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = static_cast<unsigned>(args.cluster);
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    err = cudaLaunchKernelEx(&config, kernels.sum, args);
    if (err != cudaSuccess) return err;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(args.apply_blocks), static_cast<unsigned>(kv_heads_total));
  config.blockDim = dim3(kCentringApplyThreads);
  config.dynamicSmemBytes = static_cast<size_t>(kCentringApplySmemBytes);
  config.stream = stream;
  err = cudaLaunchKernelEx(&config, kernels.apply, args);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace gaugewatch::gpu::detail
