// GPU launches of key centring (bodies and math in key_centring_kernels.cuh,
// API in key_centring.h). The CPU emulation defines the same launchers over
// its block runner (tests/cuda/key_centring_test.cpp).
// Build: target gaugewatch_cuda (sm_90a).

#include "kernels/cuda/key_centring_kernels.cuh"

namespace gaugewatch::gpu::detail {

cudaError_t launch_centring_stats(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t stream) {
  if (kv_heads_total == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(args.splits), static_cast<unsigned>(kv_heads_total));
  centring_stats_kernel<<<grid, kCentringThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_centring_apply(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t stream) {
  if (kv_heads_total == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(args.splits), static_cast<unsigned>(kv_heads_total));
  centring_apply_kernel<<<grid, kCentringThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace gaugewatch::gpu::detail
