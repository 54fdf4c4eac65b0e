// The head-dim-256 key-outer backward, backend bf16
// (bf16_keyouter_d256_kernel.cuh), and its dQ finish.
#include "kernels/cuda/bf16_keyouter_d256_kernel.cuh"
#include "kernels/cuda/bf16_keyouter_launch.cuh"

namespace gaugewatch::gpu::bf16 {

cudaError_t launch_keyouter_d256(const Args& a, cudaStream_t stream) {
  constexpr int kSmem = static_cast<int>(keyouter256::Layout::kBytes);
  cudaError_t err =
      cudaFuncSetAttribute(keyouter256::keyouter_d256_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid = keyouter256::grid(a);
  if (grid.x > 0) {
    keyouter256::keyouter_d256_kernel<<<grid, keyouter256::kThreads, kSmem, stream>>>(a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return launch_finish_rows<keyouter256::kD, Projection::kNone>(a, stream);
}

}  // namespace gaugewatch::gpu::bf16
