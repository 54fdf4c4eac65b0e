// The warp-specialized key-outer backward, backend gproj (its first pass;
// where gproj's key-outer path runs, Bf16BackwardParams::gproj_path),
// both head dims. keyouter_kernel (the fallback), the finish kernels and the
// second pass are instantiated in bf16_keyouter_d{64,128}_gproj.cu (one
// definition of each kernel in the library).
#include "kernels/cuda/bf16_keyouter_ws_launch.cuh"

namespace gaugewatch::gpu::bf16 {
extern template cudaError_t launch_keyouter<64, Projection::kGproj>(const Args&, cudaStream_t, bool);
extern template cudaError_t launch_keyouter<128, Projection::kGproj>(const Args&, cudaStream_t, bool);
extern template cudaError_t launch_keyouter_finish<64, Projection::kGproj>(const Args&, cudaStream_t, bool);
extern template cudaError_t launch_keyouter_finish<128, Projection::kGproj>(const Args&, cudaStream_t, bool);
template cudaError_t launch_keyouter_ws<64, Projection::kGproj>(const Args&, cudaStream_t);
template cudaError_t launch_keyouter_ws<128, Projection::kGproj>(const Args&, cudaStream_t);
}  // namespace gaugewatch::gpu::bf16
