// gproj's warp-specialized second pass over 256-key blocks at head dim 128
// (bf16_gproj_keys_ws_kernel.cuh; Bf16BackwardParams::gproj_pass2_keys),
// launched by launch_gproj_keys (bf16_keyouter_launch.cuh).
#include "kernels/cuda/bf16_keyouter_launch.cuh"

namespace gaugewatch::gpu::bf16 {
template bool launch_gproj_keys_ws<128, kWideKeyBlockKeys>(const Args&, cudaStream_t, cudaError_t*);

bool gproj_wide_key_map_encodable(const Args& a) { return gproj_keys_ws::key_map_encodable<128, kWideKeyBlockKeys>(a); }
}  // namespace gaugewatch::gpu::bf16
