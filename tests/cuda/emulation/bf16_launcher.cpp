// The fused BF16 backward's real host launcher (kernels/cuda/bf16_backward.cu)
// compiled against the emulated runtime, with the launches that the GPU build
// makes through <<<>>> (bf16_backward_launch.cuh, bf16_backward_delta.cu)
// re-expressed as loops over the grid; the kernel pair (Hopper or the mma.sync
// baseline) is the one the parameters name, as on the GPU.
#include "kernels/cuda/baseline/bf16_mma_sync_kernel.cuh"
#include "kernels/cuda/bf16_backward.cu"
#include "kernels/cuda/bf16_backward_hopper.cuh"
#include "kernels/cuda/bf16_delta_kernel.cuh"
#include "kernels/cuda/bf16_gproj_keys_d256_kernel.cuh"
#include "kernels/cuda/bf16_gproj_keys_kernel.cuh"
#include "kernels/cuda/bf16_gproj_keys_ws_kernel.cuh"
#include "kernels/cuda/bf16_keyouter_d256_kernel.cuh"
#include "kernels/cuda/bf16_keyouter_finish_kernels.cuh"
#include "kernels/cuda/bf16_keyouter_kernel.cuh"
#include "kernels/cuda/bf16_keyouter_ws_kernel.cuh"

namespace gaugewatch::gpu::bf16 {

cudaError_t launch_delta(const DeltaArgs& a, cudaStream_t /*stream*/) {
  if (a.rows <= 0) return cudaSuccess;
  const int64_t per_block = delta_rows_per_block(a.d);
  const dim3 grid(static_cast<unsigned>((a.rows + per_block - 1) / per_block));
  gaugewatch_emulation::run_grid(grid, 32 * kDeltaWarps, 0, [&a] { delta_kernel(a); });
  return cudaSuccess;
}

template <int D, Projection P, int BQ = mma_sync::DefaultBlocks<D, P>::kDq,
          int BKV = mma_sync::DefaultBlocks<D, P>::kDkdv>
cudaError_t launch_mma_sync(const Args& a) {
  using namespace mma_sync;
  const dim3 dq_grid(static_cast<unsigned>((a.n + kBr - 1) / kBr), static_cast<unsigned>(a.batch * a.hq));
  if (dq_grid.x > 0 && dq_grid.y > 0) {
    gaugewatch_emulation::run_grid(dq_grid, kThreads, DqSmem<D>::kBytes, [&a] { dq_kernel<D, P, BQ>(a); });
  }
  const dim3 kv_grid(static_cast<unsigned>((a.m + kBc - 1) / kBc), static_cast<unsigned>(a.batch * a.hkv));
  if (kv_grid.x > 0 && kv_grid.y > 0) {
    gaugewatch_emulation::run_grid(kv_grid, kThreads, DkdvSmem<D, P, kDoubleBufferQ<D, P, BKV>>::kBytes,
                                   [&a] { dkdv_kernel<D, P, BKV>(a); });
  }
  return cudaSuccess;
}

template <int D, Projection P>
cudaError_t launch_hopper(const Args& a) {
  const dim3 dq_grid = hopper::query_tile_grid(a);
  if (dq_grid.x > 0) {
    gaugewatch_emulation::run_grid(dq_grid, hopper::kThreads, hopper::DqLayout<D>::kBytes,
                                   [&a] { hopper::dq_kernel<D, P>(a); });
  }
  const dim3 kv_grid = hopper::key_block_grid(a);
  if (kv_grid.x > 0) {
    gaugewatch_emulation::run_grid(kv_grid, hopper::kThreads, hopper::KvLayout<D, P>::kBytes,
                                   [&a] { hopper::dkdv_kernel<D, P>(a); });
  }
  return cudaSuccess;
}

template <int D, Projection P>
cudaError_t launch(const Args& a, Bf16KernelPair pair, cudaStream_t /*stream*/) {
  if constexpr (D == 256) {
    return launch_mma_sync<D, P>(a);
  } else {
    if (pair == Bf16KernelPair::kMmaSyncBaseline) return launch_mma_sync<D, P>(a);
    return launch_hopper<D, P>(a);
  }
}

// bf16_keyouter_launch.cuh's launches as loops over the grid: what follows
// the key-outer kernel (launch_keyouter_finish) ...
template <int D, Projection P>
void launch_finish_rows(const Args& a) {
  const dim3 row_grid(static_cast<unsigned>((a.n + keyouter::kFinishRows - 1) / keyouter::kFinishRows),
                      static_cast<unsigned>(a.batch * a.hq));
  if (row_grid.x > 0 && row_grid.y > 0) {
    gaugewatch_emulation::run_grid(row_grid, keyouter::kFinishThreads, keyouter::kFinishSmemBytes<D, P>,
                                   [&a] { keyouter::finish_rows_kernel<D, P>(a); });
  }
}

template <int D, Projection P>
void launch_keyouter_finish(const Args& a, bool ws_second_pass) {
  const dim3 kv_grid = hopper::key_block_grid(a);
  launch_finish_rows<D, P>(a);
  if constexpr (P == Projection::kPivot) {
    const int64_t chunks = static_cast<int64_t>(a.m) * D / keyouter::kConvertColumns;  // per (batch, kv head)
    const dim3 keys_grid(static_cast<unsigned>((chunks + keyouter::kConvertThreads - 1) / keyouter::kConvertThreads),
                         static_cast<unsigned>(a.batch * a.hkv));
    if (keys_grid.x > 0 && keys_grid.y > 0) {
      gaugewatch_emulation::run_grid(keys_grid, keyouter::kConvertThreads, 0,
                                     [&a] { keyouter::finish_keys_kernel<D>(a); });
    }
  }
  if constexpr (P == Projection::kGproj) {
    // launch_gproj_keys: the 256-key pass where asked for, else the
    // 128-key one, where their maps encode.
    auto run_ws = [&a]<int kKeys>() {
      gproj_keys_ws::Maps maps{};
      if (!gproj_keys_ws::encode_maps<D, kKeys>(a, &maps)) return false;
      const dim3 grid = hopper::key_block_grid<kKeys>(a);
      if (grid.x > 0) {
        gaugewatch_emulation::run_grid(grid, gproj_keys_ws::kThreads, gproj_keys_ws::Layout<D, kKeys>::kBytes,
                                       [&a, &maps] { gproj_keys_ws::gproj_keys_ws_kernel<D, kKeys>(maps, a); });
      }
      return true;
    };
    bool ran = ws_second_pass && a.gproj_pass2_keys == kWideKeyBlockKeys &&
               run_ws.template operator()<kWideKeyBlockKeys>();
    if (!ran) ran = ws_second_pass && run_ws.template operator()<kKeyBlockKeys>();
    if (!ran && kv_grid.x > 0) {
      gaugewatch_emulation::run_grid(kv_grid, keyouter::kThreads, gproj_keys::Layout<D>::kBytes,
                                     [&a] { gproj_keys::gproj_keys_kernel<D>(a); });
    }
    launch_finish_rows<D, Projection::kNone>(a);
  } else {
    (void)ws_second_pass;
  }
}

// ... keyouter_kernel ...
template <int D, Projection P>
cudaError_t launch_keyouter(const Args& a, cudaStream_t /*stream*/, bool ws_second_pass) {
  const dim3 kv_grid = hopper::key_block_grid(a);
  if (kv_grid.x > 0) {
    gaugewatch_emulation::run_grid(kv_grid, keyouter::kThreads, keyouter::Layout<D, P>::kBytes,
                                   [&a] { keyouter::keyouter_kernel<D, P>(a); });
  }
  launch_keyouter_finish<D, P>(a, ws_second_pass);
  return cudaSuccess;
}

// ... and bf16_keyouter_ws_launch.cuh's: the warp-specialized kernel (384
// threads per block: the producer warpgroup and the two compute warpgroups),
// keyouter_kernel where the emulated encode refuses a map, as on the GPU.
template <int D, Projection P>
cudaError_t launch_keyouter_ws(const Args& a, cudaStream_t stream) {
  keyouter_ws::Maps maps{};
  if (!keyouter_ws::encode_maps<D>(a, &maps) || !keyouter_ws::encode_dq_map<D>(a, &maps)) {
    return launch_keyouter<D, P>(a, stream);
  }
  const dim3 kv_grid = hopper::key_block_grid(a);
  if (kv_grid.x > 0) {
    gaugewatch_emulation::run_grid(kv_grid, keyouter_ws::kThreads, keyouter_ws::Layout<D, P>::kBytes,
                                   [&a, &maps] { keyouter_ws::keyouter_ws_kernel<D, P>(maps, a); });
  }
  launch_keyouter_finish<D, P>(a, /*ws_second_pass=*/true);
  return cudaSuccess;
}

// ... and bf16_keyouter_d256.cu's and bf16_keyouter_d256_gproj.cu's: the
// head-dim-256 key-outer kernel and its finish (gproj: lambda, the second
// pass, dQ).
template <Projection P>
cudaError_t launch_d256(const Args& a) {
  const dim3 grid = keyouter256::grid(a);
  tma::TensorMap dq_map{};
  if (!keyouter256::encode_dq_map(a, &dq_map)) return cudaErrorNotSupported;
  if (grid.x > 0) {
    gaugewatch_emulation::run_grid(grid, keyouter256::kThreads, keyouter256::Layout::kBytes,
                                   [&a, &dq_map] { keyouter256::keyouter_d256_kernel<P>(dq_map, a); });
  }
  if constexpr (P == Projection::kGproj) {
    launch_finish_rows<keyouter256::kD, P>(a);
    if (grid.x > 0) {
      gaugewatch_emulation::run_grid(grid, gproj_keys256::kThreads, gproj_keys256::Layout::kBytes,
                                     [&a, &dq_map] { gproj_keys256::gproj_keys_d256_kernel<keyouter256::kD>(dq_map, a); });
    }
    launch_finish_rows<keyouter256::kD, Projection::kNone>(a);
  } else {
    launch_keyouter_finish<keyouter256::kD, P>(a, false);
  }
  return cudaSuccess;
}

cudaError_t launch_keyouter_d256(const Args& a, Projection projection, cudaStream_t /*stream*/) {
  switch (projection) {
    case Projection::kPivot: return launch_d256<Projection::kPivot>(a);
    case Projection::kGproj: return launch_d256<Projection::kGproj>(a);
    default: return launch_d256<Projection::kNone>(a);
  }
}

bool keyouter_ws_maps_encodable(const Args& a, int head_dim) { return keyouter_ws::maps_encodable(a, head_dim); }

bool gproj_wide_key_map_encodable(const Args& a, int head_dim) {
  return head_dim == 64 ? gproj_keys_ws::key_map_encodable<64, kWideKeyBlockKeys>(a)
                        : gproj_keys_ws::key_map_encodable<128, kWideKeyBlockKeys>(a);
}

template cudaError_t launch_keyouter_ws<64, Projection::kNone>(const Args&, cudaStream_t);
template cudaError_t launch_keyouter_ws<64, Projection::kPivot>(const Args&, cudaStream_t);
template cudaError_t launch_keyouter_ws<64, Projection::kGproj>(const Args&, cudaStream_t);
template cudaError_t launch_keyouter_ws<128, Projection::kNone>(const Args&, cudaStream_t);
template cudaError_t launch_keyouter_ws<128, Projection::kPivot>(const Args&, cudaStream_t);
template cudaError_t launch_keyouter_ws<128, Projection::kGproj>(const Args&, cudaStream_t);
template cudaError_t launch_keyouter<64, Projection::kNone>(const Args&, cudaStream_t, bool);
template cudaError_t launch_keyouter<64, Projection::kPivot>(const Args&, cudaStream_t, bool);
template cudaError_t launch_keyouter<64, Projection::kGproj>(const Args&, cudaStream_t, bool);
template cudaError_t launch_keyouter<128, Projection::kNone>(const Args&, cudaStream_t, bool);
template cudaError_t launch_keyouter<128, Projection::kPivot>(const Args&, cudaStream_t, bool);
template cudaError_t launch_keyouter<128, Projection::kGproj>(const Args&, cudaStream_t, bool);

template cudaError_t launch<64, Projection::kNone>(const Args&, Bf16KernelPair, cudaStream_t);
template cudaError_t launch<64, Projection::kGproj>(const Args&, Bf16KernelPair, cudaStream_t);
template cudaError_t launch<64, Projection::kPivot>(const Args&, Bf16KernelPair, cudaStream_t);
template cudaError_t launch<128, Projection::kNone>(const Args&, Bf16KernelPair, cudaStream_t);
template cudaError_t launch<128, Projection::kGproj>(const Args&, Bf16KernelPair, cudaStream_t);
template cudaError_t launch<128, Projection::kPivot>(const Args&, Bf16KernelPair, cudaStream_t);
template cudaError_t launch<256, Projection::kNone>(const Args&, Bf16KernelPair, cudaStream_t);
template cudaError_t launch<256, Projection::kGproj>(const Args&, Bf16KernelPair, cudaStream_t);
template cudaError_t launch<256, Projection::kPivot>(const Args&, Bf16KernelPair, cudaStream_t);

}  // namespace gaugewatch::gpu::bf16
