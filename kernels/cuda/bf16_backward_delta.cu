// The delta pre-pass launch of the fused BF16 backward (kernel body in
// bf16_delta_kernel.cuh): 8 to 32 query rows per 256-thread block by head dim.
#include "kernels/cuda/bf16_delta_kernel.cuh"

namespace gaugewatch::gpu::bf16 {

cudaError_t launch_delta(const DeltaArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  const int64_t per_block = delta_rows_per_block(a.d);
  delta_kernel<<<static_cast<unsigned>((a.rows + per_block - 1) / per_block), 32 * kDeltaWarps, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace gaugewatch::gpu::bf16
