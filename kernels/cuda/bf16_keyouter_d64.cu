// The key-outer one-pass backward at head dim 64: backends bf16 and pivot.
#include "kernels/cuda/bf16_keyouter_launch.cuh"

namespace gaugewatch::gpu::bf16 {
template cudaError_t launch_keyouter<64, Projection::kNone>(const Args&, cudaStream_t, bool);
template cudaError_t launch_keyouter<64, Projection::kPivot>(const Args&, cudaStream_t, bool);
// Also the finish alone, for the warp-specialized kernel's launch
// (bf16_keyouter_ws_d64.cu): its kernels are instantiated here only.
template cudaError_t launch_keyouter_finish<64, Projection::kNone>(const Args&, cudaStream_t, bool);
template cudaError_t launch_keyouter_finish<64, Projection::kPivot>(const Args&, cudaStream_t, bool);
}  // namespace gaugewatch::gpu::bf16
