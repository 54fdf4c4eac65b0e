// GPU launch of key centring (body and math in key_centring_kernels.cuh, API
// in key_centring.h): a grid of (cluster, B * Hkv) blocks in clusters of
// (cluster, 1, 1), with the block's dynamic shared memory. The CPU emulation
// defines the same launcher over its block runner (tests/cuda/key_centring_test.cpp).
// Build: target gaugewatch_cuda (sm_90a).

#include "kernels/cuda/key_centring_kernels.cuh"

namespace gaugewatch::gpu::detail {

cudaError_t launch_centring(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t stream) {
  if (kv_heads_total == 0) return cudaSuccess;
  const int64_t smem = centring_smem_bytes(args);
  cudaError_t err =
      cudaFuncSetAttribute(centring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(args.cluster), static_cast<unsigned>(kv_heads_total));
  config.blockDim = dim3(kCentringThreads);
  config.dynamicSmemBytes = static_cast<size_t>(smem);
  config.stream = stream;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = static_cast<unsigned>(args.cluster);
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  err = cudaLaunchKernelEx(&config, centring_kernel, args);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace gaugewatch::gpu::detail
