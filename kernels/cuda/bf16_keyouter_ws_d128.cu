// The warp-specialized key-outer backward at head dim 128: backends bf16 and
// pivot (the default: Bf16BackwardParams::keyouter_warp_specialized). Its fallback,
// keyouter_kernel, and the finish kernels are instantiated in
// bf16_keyouter_d128.cu (one definition of each kernel in the library).
#include "kernels/cuda/bf16_keyouter_ws_launch.cuh"

namespace gaugewatch::gpu::bf16 {
extern template cudaError_t launch_keyouter<128, Projection::kNone>(const Args&, cudaStream_t, bool);
extern template cudaError_t launch_keyouter<128, Projection::kPivot>(const Args&, cudaStream_t, bool);
extern template cudaError_t launch_keyouter_finish<128, Projection::kNone>(const Args&, cudaStream_t, bool);
extern template cudaError_t launch_keyouter_finish<128, Projection::kPivot>(const Args&, cudaStream_t, bool);
template cudaError_t launch_keyouter_ws<128, Projection::kNone>(const Args&, cudaStream_t);
template cudaError_t launch_keyouter_ws<128, Projection::kPivot>(const Args&, cudaStream_t);
}  // namespace gaugewatch::gpu::bf16
