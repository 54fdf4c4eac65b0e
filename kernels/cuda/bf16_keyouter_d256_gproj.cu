// The head-dim-256 key-outer backward, backend gproj: the key-outer kernel's
// first pass (bf16_keyouter_d256_kernel.cuh), lambda and bf16(-lambda q)
// (finish_rows_kernel<256, kGproj>), the second pass
// (bf16_gproj_keys_d256_kernel.cuh), then dQ (finish_rows_kernel<256,
// kNone>), on one stream.
#include "kernels/cuda/bf16_gproj_keys_d256_kernel.cuh"
#include "kernels/cuda/bf16_keyouter_d256_launch.cuh"
#include "kernels/cuda/bf16_keyouter_launch.cuh"

namespace gaugewatch::gpu::bf16 {

cudaError_t launch_keyouter_d256_gproj(const Args& a, cudaStream_t stream) {
  constexpr int kD = keyouter256::kD;
  tma::TensorMap dq_map{};
  cudaError_t err = d256_dq_map(a, &dq_map);
  if (err == cudaSuccess) err = launch_keyouter_d256_kernel<Projection::kGproj>(a, dq_map, stream);
  if (err == cudaSuccess) err = launch_finish_rows<kD, Projection::kGproj>(a, stream);
  if (err != cudaSuccess) return err;
  constexpr int kSmem = static_cast<int>(gproj_keys256::Layout::kBytes);
  err = cudaFuncSetAttribute(gproj_keys256::gproj_keys_d256_kernel<kD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid = keyouter256::grid(a);
  if (grid.x > 0) {
    gproj_keys256::gproj_keys_d256_kernel<kD><<<grid, gproj_keys256::kThreads, kSmem, stream>>>(dq_map, a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return launch_finish_rows<kD, Projection::kNone>(a, stream);
}

}  // namespace gaugewatch::gpu::bf16
