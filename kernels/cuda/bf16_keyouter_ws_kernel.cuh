#pragma once
// Warp-specialized key-outer kernel of the fused BF16 backward, backends bf16
// and pivot, and gproj's first pass where gproj's key-outer path is opted
// into (issue 13: FlashAttention-3's structure): the same per-tile work
// as keyouter_kernel (bf16_keyouter_kernel.cuh, KeyTile: the same
// instructions on the same operands, so S, dP, t, r, dV, dK and every dQ tile
// are bit for bit those of keyouter_kernel), but the compute warpgroups never
// load and never wait at a block barrier for loads. The default for bf16
// and pivot without bitwise determinism (Bf16BackwardParams::
// keyouter_warp_specialized; torch ops: GAUGEWATCH_BF16_KERNEL=key_outer runs
// keyouter_kernel instead): 0.72-0.77x keyouter_kernel's time for bf16 on the H200
// (kernels/cuda/README.md).
//
// Block: 384 threads, 128 keys of one (batch, kv head).
//   warpgroup 0, producer (setmaxnreg.dec to kProducerRegs): its warp 0 loads
//     K and V of the block's keys once (TMA, barrier kv_full), then for every
//     iteration (query head, query tile; keyouter_kernel's order) waits for a
//     free stage of a 2-stage ring (empty[s]), announces the Q and dO tiles'
//     bytes and issues their TMA loads (lane 0) and writes the tile's per-row
//     inputs (lse, delta, the visible key range; lanes 0..31, two rows each)
//     to the stage; then each lane arrives on full[s] (1 + 32 arrivals + the
//     bytes). Its warp 1 is the dQ writer (KeyTile::writer_loop, as
//     FlashAttention-3's): it waits
//     for each iteration's staging tile (keyouter::DqHandoff), adds it to
//     dQacc by TMA tensor reductions (lane 0: D / 32 boxes of 64 rows x 32
//     floats through dQacc's map),
//     for pivot adds the rows' staged argmax codes and rho, for gproj their
//     m and rho (keyouter::StatsHandoff) while the copy engine reads the
//     tile, and
//     hands the tile back. The other warps only give their registers
//     back.
//   warpgroups 1 and 2, compute (setmaxnreg.inc to kComputeRegs): KeyTile
//     with tid = threadIdx.x - 128, keys 64 (warpgroup - 1)..; per iteration
//     wait full[s], KeyTile::compute, and after the tile's MMAs are complete
//     every compute thread arrives on empty[s] (256 arrivals). One barrier
//     of the compute threads per iteration (kComputeBarrier, before dQ,
//     which reads both warpgroups' t); otherwise each warpgroup meets only
//     its own warps, the writer (for the staging tile) and the pingpong.
// Stage s of iteration it: s = it % 2, ring round it / 2, consumers wait
// full[s] with parity (round & 1), the producer empty[s] with
// (round & 1) ^ 1 (mbarrier.cuh).
// Shared memory: keyouter::Layout<D, P, true> (the two Q/dO buffers and staged row
// arrays are the ring's stages), a second set of t tiles, the
// 5 mbarriers, and for pivot and gproj the staged statistics
// (keyouter::StatsHandoff).
//
// TMA maps (host, encode_maps): Q and dO as (B, Hq, N, d), K and V as
// (B, Hkv, M, d), rank 4 with the operands' strides, boxes of 64 (Q, dO) or
// 128 (K, V) rows x 64 columns, rows past N (M) read as zeros as
// keyouter_kernel's zero-filled cp.async. Packed varlen needs nothing more:
// its segments are rows of the one (N, d) matrix per head, masked by the
// visible key ranges as in keyouter_kernel. Where a map cannot be encoded
// (a stride or base the copy engine refuses; bf16_backward.cu's validate()
// already requires 16-byte strides) the launcher runs keyouter_kernel instead
// (bf16_keyouter_ws_launch.cuh).
// gproj: this kernel is its first pass; the finish kernels and the second
// pass over the keys (bf16_gproj_keys_ws_kernel.cuh) follow as after
// keyouter_kernel (launch_keyouter_finish).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_keyouter_kernel.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/setmaxnreg.cuh"
#include "kernels/cuda/tma.cuh"

namespace gaugewatch::gpu::bf16::keyouter_ws {

using keyouter::kKvKeys;
using keyouter::kKvRows;

inline constexpr int kStages = 2;  // keyouter::Layout's two Q/dO buffers
inline constexpr int kProducerThreads = wgmma::kWarpgroupThreads;
inline constexpr int kComputeThreads = 2 * wgmma::kWarpgroupThreads;
inline constexpr int kThreads = kProducerThreads + kComputeThreads;
static_assert(kComputeThreads == keyouter::kThreads, "KeyTile's 256 compute threads");
// The writer warp adds dQ at both head dims and for every backend (at D = 64
// each warpgroup computes 32 of the tile's 64 columns over all 128 keys,
// m64n32, KeyTile), against the compute threads adding two partials per tile
// after a barrier of all 256 (keyouter_kernel's way). On the H200 (B4 H16
// N4096 d64 causal, bench/results/bench_bf16_backward-d64-writer-h200-2026-12-04.md)
// the writer took bf16's kernel to 0.939x its time and pivot's to 0.977x
// (three rounds of alternating processes); gproj's first pass took it at
// D = 64 with its rho and m atomics after the dQ tile's hand-over
// (KeyTile::kStatsAfterHandoff): 0.978x on the H100 (two rounds, 0.975-0.982;
// with them before the hand-over 1.008x,
// bench/results/bench_bf16_backward-gproj-d64-writer-h100-2026-12-05.md).
// 384 threads at 1 block per SM start at 168 registers each (65,536 / 384
// rounded down to a multiple of 8), and that is the block's pool: the
// producer warpgroup gives some back, the compute warpgroups take them, and
// producer + 2 x compute <= 3 x 168 (setmaxnreg.cuh; more and setmaxnreg.inc
// waits forever). The writer warp's loop and bulk reductions spill at 32 (24
// bytes at D = 128, ptxas -v), so 40 / 232, the whole pool
// (FlashAttention-3's split without a writer is 24 / 240); the compute
// threads fit 232 without spilling at both head dims.
inline constexpr int kLaunchRegs = 168;
inline constexpr int kProducerRegs = 40;
inline constexpr int kComputeRegs = 232;
static_assert(kProducerRegs + 2 * kComputeRegs <= 3 * kLaunchRegs, "the block's register pool");
// Named barriers: 1, 2 (KeyTile's per-warpgroup barriers, 1 + wg), 3 (the
// pingpong), this one for the 256 compute threads, then keyouter::DqHandoff's
// (5 ..).
inline constexpr int kComputeBarrier = 4;
static_assert(keyouter::DqHandoff::kFull > kComputeBarrier, "barrier ids");
inline constexpr uint32_t kFullArrivals = 1 + 32;  // lane 0's expect_tx + every producer lane's rows

// The operands' maps and dQacc's, the destination of the writer warp's
// tensor reductions.
struct Maps {
  tma::TensorMap q, grad_out, k, v, dq_accum;
};

// The compute warpgroups' per-tile work.
template <int D, Projection P>
using Tile = keyouter::KeyTile<D, P, kProducerThreads, true>;

template <int D, Projection P>
struct Layout : keyouter::Layout<D, P, true> {
  using Base = keyouter::Layout<D, P, true>;
  static_assert(Base::kBytes == Base::kDqEnd + 1024, "the base layout ends at its dQ tiles");
  // Bytes from the aligned base: the second set of t tiles (Tile::kTSets, at
  // Base::kDqEnd), then the mbarriers full[kStages], empty[kStages],
  // kv_full, then (pivot and gproj, KeyTile::kStatsByWriter) the staged
  // statistics.
  static constexpr size_t kBarriers =
      Base::kDqEnd + (Tile<D, P>::kTSets - 1) * 2 * static_cast<size_t>(Base::kScoreTile) * 2;
  static constexpr int kBarrierCount = 2 * kStages + 1;
  static constexpr size_t kStats = kBarriers + kBarrierCount * sizeof(uint64_t);
  static constexpr size_t kStatsBytes = Tile<D, P>::kStatsByWriter ? keyouter::StatsHandoff<P>::kBytes : 0;
  static constexpr size_t kBytes = kStats + kStatsBytes + 1024;
  static_assert(kBarriers % 8 == 0, "mbarriers are 8-byte aligned");
};

// An operand of `a` with `heads` heads of `rows` rows of D columns at
// strides s, as a rank-4 TMA tensor (B, heads, rows, D).
template <int D>
inline tma::RowsTensor rows_tensor(const Args& a, const void* base, int heads, int rows, const OperandStrides& s) {
  tma::RowsTensor t;
  t.base = base;
  t.batch = static_cast<uint64_t>(a.batch);
  t.heads = static_cast<uint64_t>(heads);
  t.rows = static_cast<uint64_t>(rows);
  t.cols = D;
  t.batch_stride = static_cast<uint64_t>(s.batch);
  t.head_stride = static_cast<uint64_t>(s.head);
  t.row_stride = static_cast<uint64_t>(s.row);
  return t;
}

// The four maps for the operands of `a`, or false where one cannot be encoded
// (the caller then runs keyouter_kernel).
template <int D>
inline bool encode_maps(const Args& a, Maps* maps) {
  auto rows_tensor = [&](const void* base, int heads, int rows, const OperandStrides& s) {
    return keyouter_ws::rows_tensor<D>(a, base, heads, rows, s);
  };
  if (a.batch < 1 || a.hq < 1 || a.hkv < 1 || a.n < 1 || a.m < 1) return false;
  if (a.q_strides.batch < 0 || a.q_strides.head < 0 || a.k_strides.batch < 0 || a.k_strides.head < 0 ||
      a.v_strides.batch < 0 || a.v_strides.head < 0 || a.grad_out_strides.batch < 0 || a.grad_out_strides.head < 0) {
    return false;
  }
  const tma::EncodeStatus st[4] = {
      tma::encode_bf16_rows_map(&maps->q, rows_tensor(a.q, a.hq, a.n, a.q_strides), kKvRows),
      tma::encode_bf16_rows_map(&maps->grad_out, rows_tensor(a.grad_out, a.hq, a.n, a.grad_out_strides), kKvRows),
      tma::encode_bf16_rows_map(&maps->k, rows_tensor(a.k, a.hkv, a.m, a.k_strides), kKvKeys),
      tma::encode_bf16_rows_map(&maps->v, rows_tensor(a.v, a.hkv, a.m, a.v_strides), kKvKeys)};
  for (const tma::EncodeStatus s : st) {
    if (s != tma::EncodeStatus::kOk) return false;
  }
  return true;
}

// dQacc's map for the writer warp, or false where it cannot be encoded (the
// caller then runs keyouter_kernel). The workspace's dQacc is dense and
// aligned: only a missing driver entry point refuses it.
template <int D>
inline bool encode_dq_map(const Args& a, Maps* maps) {
  return tma::encode_f32_reduce_map(&maps->dq_accum, keyouter::dq_accum_tensor<D>(a), kKvRows) == tma::EncodeStatus::kOk;
}

// Whether the maps of `a` encode at `head_dim` (64 or 128): the condition
// for launch_keyouter_ws to run this kernel (host code; bf16_uses_key_outer_ws).
inline bool maps_encodable(const Args& a, int head_dim) {
  Maps maps{};
  return head_dim == 64 ? encode_maps<64>(a, &maps) : encode_maps<128>(a, &maps);
}

template <int D, Projection P>
__global__ void __launch_bounds__(kThreads, 1) keyouter_ws_kernel(const __grid_constant__ Maps maps, const Args a) {
  GAUGEWATCH_BF16_SMEM(raw);
  uint16_t* smem = wgmma::align_1024(raw);
  using L = Layout<D, P>;
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(smem) + L::kBarriers);
  uint64_t* empty = full + kStages;
  uint64_t* kv_full = empty + kStages;
  const auto [j0, b, hk] = hopper::key_block(a);
  const RowTiles seen = tiles_seeing_keys(a, j0, kKvKeys, kKvRows);
  const Tile<D, P> kt{a, smem, j0, b, hk, seen.first, seen.count, reinterpret_cast<unsigned char*>(smem) + L::kStats};
  const int iters = kt.iterations();

  if (threadIdx.x == 0) {
    kt.init_stats();
    mbarrier::init_ring<kStages>(full, empty, kFullArrivals, kComputeThreads, kv_full);
  }
  __syncthreads();  // the barriers' init, before the roles part (the only block-wide barrier)

  if (threadIdx.x < kProducerThreads) {
    regs::setmaxnreg_dec<kProducerRegs>();
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    if (warp == keyouter::DqHandoff::kWriterWarp) {
      kt.writer_loop(lane, &maps.dq_accum);
      return;
    }
    if (warp != 0 || iters == 0) return;  // no iteration: nothing loaded, nothing in flight at exit
    if (lane == 0) {
      tma::prefetch(&maps.q);
      tma::prefetch(&maps.grad_out);
      mbarrier::arrive_expect_tx(kv_full, 2 * tma::tile_bytes<kKvKeys, D>());
      tma::load_rows_tile<kKvKeys, D>(smem + L::kK, &maps.k, j0, hk, b, kv_full);
      tma::load_rows_tile<kKvKeys, D>(smem + L::kV, &maps.v, j0, hk, b, kv_full);
    }
    for (int it = 0; it < iters; ++it) {
      const int s = it % kStages;
      const uint32_t round = static_cast<uint32_t>(it / kStages);
      mbarrier::wait(&empty[s], (round & 1u) ^ 1u);  // the compute threads are done with its last use
      const int i0 = kt.tile_row0(it);
      const int h = kt.head_of(it);
      if (lane == 0) {
        mbarrier::arrive_expect_tx(&full[s], 2 * tma::tile_bytes<kKvRows, D>());
        tma::load_rows_tile<kKvRows, D>(smem + (s ? L::kQ1 : L::kQ0), &maps.q, i0, h, b, &full[s]);
        tma::load_rows_tile<kKvRows, D>(smem + (s ? L::kG1 : L::kG0), &maps.grad_out, i0, h, b, &full[s]);
      }
      // The per-row inputs as keyouter_kernel stages them (rows past N: zeros
      // and an empty key range).
      const hopper::StagedRows sr = hopper::staged_rows(kt.rows_base(), s);
      const QueryHead qh = query_head(a, b, h);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = lane + 32 * half, row = i0 + r;
        const bool ok = row < a.n;
        const KeyRange kr = row_keys(a, row);
        sr.kb[r] = kr.begin;
        sr.ke[r] = kr.end;
        sr.lse[r] = ok ? qh.lse[row] : 0.0f;
        sr.delta[r] = ok ? a.delta[qh.row_base + row] : 0.0f;
      }
      mbarrier::arrive(&full[s]);  // release: this lane's row writes
    }
    return;
  }

  regs::setmaxnreg_inc<kComputeRegs>();
  float dk[D / 2], dv[D / 2];
  hopper::zero(dk);
  hopper::zero(dv);
  auto compute_sync = [] { wgmma::named_barrier<kComputeThreads>(kComputeBarrier); };
  if constexpr (Tile<D, P>::kRhoByMma) {
    kt.fill_ones();
    compute_sync();
  }
  if (iters > 0) mbarrier::wait(kv_full, 0);
  for (int it = 0; it < iters; ++it) {
    const int s = it % kStages;
    mbarrier::wait(&full[s], static_cast<uint32_t>(it / kStages) & 1u);
    kt.compute(
        it, smem + (s ? L::kQ1 : L::kQ0), smem + (s ? L::kG1 : L::kG0), hopper::staged_rows(kt.rows_base(), s), dk,
        dv, compute_sync, [&] { mbarrier::arrive(&empty[s]); });
  }
  kt.write_keys(dk, dv);
}

}  // namespace gaugewatch::gpu::bf16::keyouter_ws
