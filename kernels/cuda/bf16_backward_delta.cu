// The delta pre-pass launch of the fused BF16 backward (kernel body in
// bf16_delta_kernel.cuh): one warp per query row, 8 rows per block.
#include "kernels/cuda/bf16_delta_kernel.cuh"

namespace gaugewatch::gpu::bf16 {

cudaError_t launch_delta(const DeltaArgs& a, cudaStream_t stream) {
  if (a.rows <= 0) return cudaSuccess;
  delta_kernel<<<static_cast<unsigned>((a.rows + 7) / 8), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace gaugewatch::gpu::bf16
