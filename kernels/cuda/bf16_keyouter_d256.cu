// The head-dim-256 key-outer backward, backends bf16 and pivot
// (bf16_keyouter_d256_kernel.cuh), and its finish.
#include "kernels/cuda/bf16_keyouter_d256_kernel.cuh"
#include "kernels/cuda/bf16_keyouter_launch.cuh"

namespace gaugewatch::gpu::bf16 {
namespace {

template <Projection P>
cudaError_t launch_d256(const Args& a, cudaStream_t stream) {
  constexpr int kSmem = static_cast<int>(keyouter256::Layout::kBytes);
  cudaError_t err =
      cudaFuncSetAttribute(keyouter256::keyouter_d256_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid = keyouter256::grid(a);
  if (grid.x > 0) {
    keyouter256::keyouter_d256_kernel<P><<<grid, keyouter256::kThreads, kSmem, stream>>>(a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return launch_keyouter_finish<keyouter256::kD, P>(a, stream);
}

}  // namespace

cudaError_t launch_keyouter_d256(const Args& a, Projection projection, cudaStream_t stream) {
  return projection == Projection::kPivot ? launch_d256<Projection::kPivot>(a, stream)
                                          : launch_d256<Projection::kNone>(a, stream);
}

}  // namespace gaugewatch::gpu::bf16
