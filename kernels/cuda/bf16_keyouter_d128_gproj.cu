// The key-outer backward at head dim 128, backend gproj: the key-outer kernel
// (U by float4 atomics), the per-row finish and the second pass
// (bf16_gproj_keys_kernel.cuh).
#include "kernels/cuda/bf16_keyouter_launch.cuh"

namespace gaugewatch::gpu::bf16 {
template cudaError_t launch_keyouter<128, Projection::kGproj>(const Args&, cudaStream_t, bool);
// Also the finish and second pass alone, for the warp-specialized kernel's
// launch (bf16_keyouter_ws_gproj.cu): their kernels are instantiated here
// only.
template cudaError_t launch_keyouter_finish<128, Projection::kGproj>(const Args&, cudaStream_t, bool);
}  // namespace gaugewatch::gpu::bf16
