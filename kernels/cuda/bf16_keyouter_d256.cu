// The head-dim-256 key-outer backward, backends bf16 and pivot
// (bf16_keyouter_d256_kernel.cuh), and its finish; gproj in
// bf16_keyouter_d256_gproj.cu.
#include "kernels/cuda/bf16_keyouter_d256_launch.cuh"
#include "kernels/cuda/bf16_keyouter_launch.cuh"

namespace gaugewatch::gpu::bf16 {

cudaError_t launch_keyouter_d256_gproj(const Args& a, cudaStream_t stream);

namespace {

template <Projection P>
cudaError_t launch_d256(const Args& a, cudaStream_t stream) {
  tma::TensorMap dq_map{};
  cudaError_t err = d256_dq_map(a, &dq_map);
  if (err == cudaSuccess) err = launch_keyouter_d256_kernel<P>(a, dq_map, stream);
  if (err != cudaSuccess) return err;
  return launch_keyouter_finish<keyouter256::kD, P>(a, stream);
}

}  // namespace

cudaError_t launch_keyouter_d256(const Args& a, Projection projection, cudaStream_t stream) {
  switch (projection) {
    case Projection::kPivot:
      return launch_d256<Projection::kPivot>(a, stream);
    case Projection::kGproj:
      return launch_keyouter_d256_gproj(a, stream);
    default:
      return launch_d256<Projection::kNone>(a, stream);
  }
}

}  // namespace gaugewatch::gpu::bf16
