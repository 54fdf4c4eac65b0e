#pragma once
// Launch template of the warp-specialized key-outer kernel
// (bf16_keyouter_ws_kernel.cuh), backends bf16, pivot and gproj (its first
// pass): the TMA maps, the kernel, then the same finish as keyouter_kernel
// (launch_keyouter_finish; gproj: its second pass, warp-specialized too). Where a map cannot be
// encoded (encode_maps: a stride or base the copy engine refuses, no driver
// entry point) it runs keyouter_kernel (launch_keyouter, instantiated in
// bf16_keyouter_d{64,128}{,_gproj}.cu) instead: the same results up to the
// atomics' order. Instantiated in bf16_keyouter_ws_d{64,128}.cu and
// bf16_keyouter_ws_gproj.cu.

#include <cuda_runtime.h>

#include "kernels/cuda/bf16_keyouter_launch.cuh"
#include "kernels/cuda/bf16_keyouter_ws_kernel.cuh"

namespace gaugewatch::gpu::bf16 {

template <int D, Projection P>
cudaError_t launch_keyouter_ws(const Args& a, cudaStream_t stream) {
  keyouter_ws::Maps maps{};
  if (!keyouter_ws::encode_maps<D>(a, &maps) || !keyouter_ws::encode_dq_map<D>(a, &maps)) {
    return launch_keyouter<D, P>(a, stream);
  }
  constexpr int kSmem = static_cast<int>(keyouter_ws::Layout<D, P>::kBytes);
  static_assert(kSmem + 1024 <= 228 * 1024, "warp-specialized key-outer kernel: a block does not fit one SM");
  cudaError_t err = cudaFuncSetAttribute(keyouter_ws::keyouter_ws_kernel<D, P>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 kv_grid = hopper::key_block_grid(a);
  if (kv_grid.x > 0) {
    keyouter_ws::keyouter_ws_kernel<D, P><<<kv_grid, keyouter_ws::kThreads, kSmem, stream>>>(maps, a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return launch_keyouter_finish<D, P>(a, stream, /*ws_second_pass=*/true);
}

}  // namespace gaugewatch::gpu::bf16
