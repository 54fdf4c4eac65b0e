#pragma once
// Launch template of the key-outer one-pass backward (bf16_keyouter_kernel.cuh)
// for one (head dim, projection): the key-outer kernel, the per-row finish
// (dQ, pivot's fix-ups; gproj: lambda and bf16(-lambda q)), then for pivot
// the dK rounding and for gproj the second pass over the keys
// (bf16_gproj_keys_kernel.cuh: dK, and -lambda U into dQacc) and dQ's
// finish, on one stream. The caller (bf16_backward.cu)
// has run the delta pre-pass and zeroed the accumulators. Instantiated in
// bf16_keyouter_d{64,128}{,_gproj}.cu; launch_keyouter_finish is shared with
// the warp-specialized kernel's launch (bf16_keyouter_ws_launch.cuh).

#include <cuda_runtime.h>

#include "kernels/cuda/bf16_gproj_keys_kernel.cuh"
#include "kernels/cuda/bf16_gproj_keys_ws_kernel.cuh"
#include "kernels/cuda/bf16_keyouter_finish_kernels.cuh"
#include "kernels/cuda/bf16_keyouter_kernel.cuh"

namespace gaugewatch::gpu::bf16 {

// gproj_keys_ws_kernel<D, kKeys> over the grid of kKeys-key blocks, where
// its TMA maps encode (false otherwise: nothing launched; *err the launch's
// result when true).
template <int D, int kKeys>
bool launch_gproj_keys_ws(const Args& a, cudaStream_t stream, cudaError_t* err) {
  gproj_keys_ws::Maps maps{};
  if (!gproj_keys_ws::encode_maps<D, kKeys>(a, &maps)) return false;
  constexpr int kSmem = static_cast<int>(gproj_keys_ws::Layout<D, kKeys>::kBytes);
  static_assert(gproj_keys_ws::kBlocksPerSm<D, kKeys> * (kSmem + 1024) <= 228 * 1024,
                "gproj second pass (warp-specialized): blocks do not fit one SM's shared memory");
  *err = cudaFuncSetAttribute(gproj_keys_ws::gproj_keys_ws_kernel<D, kKeys>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (*err != cudaSuccess) return true;
  const dim3 grid = hopper::key_block_grid<kKeys>(a);
  if (grid.x > 0) {
    gproj_keys_ws::gproj_keys_ws_kernel<D, kKeys><<<grid, gproj_keys_ws::kThreads, kSmem, stream>>>(maps, a);
    *err = cudaGetLastError();
  }
  return true;
}
// The 256-key passes have their own translation unit (bf16_gproj_keys_ws_wide.cu).
extern template bool launch_gproj_keys_ws<64, kWideKeyBlockKeys>(const Args&, cudaStream_t, cudaError_t*);
extern template bool launch_gproj_keys_ws<128, kWideKeyBlockKeys>(const Args&, cudaStream_t, cudaError_t*);

// gproj's second pass: gproj_keys_ws_kernel when warp_specialized and its
// TMA maps encode (over 256-key blocks where a.gproj_pass2_keys asks for
// them), gproj_keys_kernel otherwise (the same dK).
template <int D>
cudaError_t launch_gproj_keys(const Args& a, cudaStream_t stream, bool warp_specialized) {
  if (warp_specialized) {
    cudaError_t err = cudaSuccess;
    if (a.gproj_pass2_keys == kWideKeyBlockKeys && launch_gproj_keys_ws<D, kWideKeyBlockKeys>(a, stream, &err)) {
      return err;
    }
    if (launch_gproj_keys_ws<D, kKeyBlockKeys>(a, stream, &err)) return err;
  }
  const dim3 kv_grid = hopper::key_block_grid(a);
  constexpr int kKeysSmem = static_cast<int>(gproj_keys::Layout<D>::kBytes);
  static_assert(gproj_keys::kBlocksPerSm<D> * (kKeysSmem + 1024) <= 228 * 1024,
                "gproj second pass: blocks do not fit one SM's shared memory");
  cudaError_t err =
      cudaFuncSetAttribute(gproj_keys::gproj_keys_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, kKeysSmem);
  if (err != cudaSuccess) return err;
  if (kv_grid.x > 0) {
    gproj_keys::gproj_keys_kernel<D><<<kv_grid, keyouter::kThreads, kKeysSmem, stream>>>(a);
    err = cudaGetLastError();
  }
  return err;
}

// finish_rows_kernel<D, P> over every query row.
template <int D, Projection P>
cudaError_t launch_finish_rows(const Args& a, cudaStream_t stream) {
  const dim3 row_grid(static_cast<unsigned>((a.n + keyouter::kFinishRows - 1) / keyouter::kFinishRows),
                      static_cast<unsigned>(static_cast<int64_t>(a.batch) * a.hq));
  if (row_grid.x == 0 || row_grid.y == 0) return cudaSuccess;
  keyouter::finish_rows_kernel<D, P>
      <<<row_grid, keyouter::kFinishThreads, keyouter::kFinishSmemBytes<D, P>, stream>>>(a);
  return cudaGetLastError();
}

// What follows the key-outer kernel (keyouter_kernel or keyouter_ws_kernel):
// the per-row finish, pivot's dK rounding; gproj: lambda, its second pass
// (warp-specialized when ws_second_pass, launch_gproj_keys), then dQ.
template <int D, Projection P>
cudaError_t launch_keyouter_finish(const Args& a, cudaStream_t stream, bool ws_second_pass = false) {
  cudaError_t err = launch_finish_rows<D, P>(a, stream);
  if (err != cudaSuccess) return err;
  if constexpr (P == Projection::kPivot) {
    const int64_t chunks = static_cast<int64_t>(a.m) * D / keyouter::kConvertColumns;  // per (batch, kv head)
    const dim3 keys_grid(static_cast<unsigned>((chunks + keyouter::kConvertThreads - 1) / keyouter::kConvertThreads),
                         static_cast<unsigned>(static_cast<int64_t>(a.batch) * a.hkv));
    if (keys_grid.x > 0 && keys_grid.y > 0) {
      keyouter::finish_keys_kernel<D><<<keys_grid, keyouter::kConvertThreads, 0, stream>>>(a);
      err = cudaGetLastError();
    }
  }
  if constexpr (P == Projection::kGproj) {
    err = launch_gproj_keys<D>(a, stream, ws_second_pass);
    if (err == cudaSuccess) err = launch_finish_rows<D, Projection::kNone>(a, stream);
  } else {
    (void)ws_second_pass;
  }
  return err;
}

template <int D, Projection P>
cudaError_t launch_keyouter(const Args& a, cudaStream_t stream, bool ws_second_pass = false) {
  constexpr int kSmem = static_cast<int>(keyouter::Layout<D, P>::kBytes);
  static_assert(kSmem + 1024 <= 228 * 1024, "key-outer kernel: a block does not fit one SM's shared memory");
  cudaError_t err =
      cudaFuncSetAttribute(keyouter::keyouter_kernel<D, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 kv_grid = hopper::key_block_grid(a);
  if (kv_grid.x > 0) {
    keyouter::keyouter_kernel<D, P><<<kv_grid, keyouter::kThreads, kSmem, stream>>>(a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return launch_keyouter_finish<D, P>(a, stream, ws_second_pass);
}

}  // namespace gaugewatch::gpu::bf16
