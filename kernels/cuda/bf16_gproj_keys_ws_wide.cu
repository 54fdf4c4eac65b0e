// gproj's warp-specialized second pass over 256-key blocks, head dims 64
// and 128 (bf16_gproj_keys_ws_kernel.cuh; Bf16BackwardParams::
// gproj_pass2_keys), launched by launch_gproj_keys (bf16_keyouter_launch.cuh).
#include "kernels/cuda/bf16_keyouter_launch.cuh"

namespace gaugewatch::gpu::bf16 {
template bool launch_gproj_keys_ws<64, kWideKeyBlockKeys>(const Args&, cudaStream_t, cudaError_t*);
template bool launch_gproj_keys_ws<128, kWideKeyBlockKeys>(const Args&, cudaStream_t, cudaError_t*);

bool gproj_wide_key_map_encodable(const Args& a, int head_dim) {
  return head_dim == 64 ? gproj_keys_ws::key_map_encodable<64, kWideKeyBlockKeys>(a)
                        : gproj_keys_ws::key_map_encodable<128, kWideKeyBlockKeys>(a);
}
}  // namespace gaugewatch::gpu::bf16
