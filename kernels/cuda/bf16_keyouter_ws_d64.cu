// The warp-specialized key-outer backward at head dim 64: backends bf16 and
// pivot (the default: Bf16BackwardParams::keyouter_warp_specialized). Its fallback,
// keyouter_kernel, and the finish kernels are instantiated in
// bf16_keyouter_d64.cu (one definition of each kernel in the library).
#include "kernels/cuda/bf16_keyouter_ws_launch.cuh"

namespace gaugewatch::gpu::bf16 {
extern template cudaError_t launch_keyouter<64, Projection::kNone>(const Args&, cudaStream_t, bool);
extern template cudaError_t launch_keyouter<64, Projection::kPivot>(const Args&, cudaStream_t, bool);
extern template cudaError_t launch_keyouter_finish<64, Projection::kNone>(const Args&, cudaStream_t, bool);
extern template cudaError_t launch_keyouter_finish<64, Projection::kPivot>(const Args&, cudaStream_t, bool);
template cudaError_t launch_keyouter_ws<64, Projection::kNone>(const Args&, cudaStream_t);
template cudaError_t launch_keyouter_ws<64, Projection::kPivot>(const Args&, cudaStream_t);

// For bf16_uses_key_outer_ws (bf16_backward.cu), both head dims (host code).
bool keyouter_ws_maps_encodable(const Args& a, int head_dim) { return keyouter_ws::maps_encodable(a, head_dim); }
}  // namespace gaugewatch::gpu::bf16
