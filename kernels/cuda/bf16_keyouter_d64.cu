// The key-outer one-pass backward at head dim 64: backends bf16 and pivot.
#include "kernels/cuda/bf16_keyouter_launch.cuh"

namespace gaugewatch::gpu::bf16 {
template cudaError_t launch_keyouter<64, Projection::kNone>(const Args&, cudaStream_t);
template cudaError_t launch_keyouter<64, Projection::kPivot>(const Args&, cudaStream_t);
}  // namespace gaugewatch::gpu::bf16
