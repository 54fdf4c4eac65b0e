#pragma once
// Warp-specialized second pass of backend gproj on the key-outer path
// (math: kernels/cuda/bf16_backward.h; the pass: bf16_gproj_keys_kernel.cuh):
// C_j = sum_i r_ij bf16(-lambda_i q_i), dK'_j = bf16(alpha (dKacc_j + C_j)),
// and dQacc_i += -lambda_i U_i per tile, with gproj_keys_kernel's per-tile
// work (store_r, c_mma, u_mma, add_u, write_dk: the same instructions on the
// same operands, so the same r bit for bit, C summed in the same order: the
// same dK, and the same U terms) fed by a TMA producer warp through an
// mbarrier ring instead of cp.async loads by every thread behind a block
// barrier per tile. The second pass reads two row tiles (Q and
// bf16(-lambda Q)) per tile pair for 3 products where the first pass reads
// two for 5, so its loads weigh more: kStages stages in flight, and two
// blocks per SM at D = 64 as gproj_keys_kernel.
// Runs where the key-outer gproj runs warp-specialized
// (Bf16BackwardParams::keyouter_warp_specialized: after keyouter_ws_kernel);
// gproj_keys_kernel where its maps cannot be encoded and without warp
// specialization.
//
// Block: 384 threads, 128 keys of one (batch, kv head).
//   warpgroup 0, producer (setmaxnreg.dec to kProducerRegs): its warp 0 loads
//     the block's K once (TMA, barrier k_full), then per iteration (query
//     head, query tile; the first pass's order) waits for a free stage
//     (empty[s]), lane 0 announces and issues the Q and bf16(-lambda Q)
//     tiles' loads (with the last tile's, an L2 prefetch of the block's
//     dKacc rows, which write_dk reads in the block's tail), and the 32
//     lanes write the tile's lse, lambda and visible key ranges (two rows
//     each) and arrive on full[s] (1 + 32 arrivals and the bytes). At
//     D = 128 its warp 1 is the writer (kUWriter): per iteration it waits
//     for the staged -lambda U tile (swizzled, tma::f32_tile_offset), adds
//     it to dQacc by tensor reductions and hands the tile back
//     (keyouter::DqHandoff, as the first pass's dQ writer).
//     The other warps only give their registers back.
//   warpgroups 1 and 2, compute (setmaxnreg.inc to kComputeRegs): per
//     iteration wait full[s], S = Q K_wg^T, r into the warpgroup's tile of
//     set it % 2, C += r^T bf16(-lambda Q) and U = r K (D = 64: over the
//     warpgroup's keys, the two partials summed in shared memory,
//     kUSplitsKeys), and once those MMAs
//     are complete every compute thread arrives on empty[s] (256 arrivals)
//     and at D = 128 stores -lambda U into the staging tile for the writer
//     (gproj_keys::stage_u; it waits first for the writer to have read the
//     previous one), at D = 64 adds it to dQacc itself by float4 atomics
//     (gproj_keys::add_u). At D = 128 one barrier of both
//     warpgroups per iteration (kComputeBarrier) between the r stores and
//     the MMAs that read them (U reads both r tiles). The two sets of r
//     tiles make it the only one: a set is rewritten two iterations after
//     its MMAs, which every thread waited for before the last barrier. At
//     D = 64 (kUSplitsKeys) each warpgroup's U covers its own keys, so its
//     MMAs read only its own r tile (a barrier of its four warps before
//     them), and the barrier of both comes after the MMAs, between the
//     partials' exchange through the r tiles and its reads. No
//     block barrier after the barriers' init, no pingpong (nothing would
//     keep one warpgroup from arriving twice on it).
// Stage s of iteration it: s = it % kStages, ring round it / kStages;
// consumers wait full[s] with parity (round & 1), the producer empty[s] with
// (round & 1) ^ 1 (mbarrier.cuh).
// TMA maps (host, encode_maps): Q (B, Hq, N, d) at its strides, K (B, Hkv,
// M, d) at its strides, bf16(-lambda Q) (B, Hq, N, d) dense in the
// workspace; boxes of 64 (Q rows) or kKeys (keys) rows x 64 columns, 128-byte
// swizzle, rows past N (M) read as zeros, as gproj_keys_kernel's zero-filled
// cp.async; with the writer (kUWriter) dQacc (B Hq, N, d) FP32 for its
// reductions (boxes of 64 rows x 32 floats; rows past N are not written).
// Wide blocks (kKeys = 256, head dims 64 and 128; Bf16BackwardParams::
// gproj_pass2_keys): each warpgroup owns two 64-key tiles (keys
// 64 (2 wg + h).., h = 0, 1) and holds C for both (two m64nD accumulators),
// S of both tiles is issued at once and r of the first is stored while the
// second's MMAs run, then C of the first tile (it reads only this
// warpgroup's r) runs while r of the second is formed, and U runs over all
// 256 keys (16 steps; each
// warpgroup D / 2 columns, at D = 64 by m64n32): one -lambda U tile, so one
// set of tensor reductions by the writer warp, per 256 keys and query tile,
// and one load of each Q and bf16(-lambda Q) tile per 256 keys, half the
// 128-key pass's traffic for the same products; one block per SM (at
// D = 64 the 128-key pass runs two and adds U by atomics). The per-tile
// code is the same, so dK is bit for bit the 128-key pass's (each key's C
// sums the same tiles in the same order; a tile past a key's visible rows
// adds exact zeros) and the U terms differ only in how the block sums its
// keys. At D = 128 two stages (the 256-key K tile takes the third's room).
// Build: launched by bf16_keyouter_launch.cuh (launch_keyouter_finish; the
// wide pass instantiated in bf16_gproj_keys_ws_wide.cu); emulation:
// tests/cuda/emulation/bf16_launcher.cpp. Tests:
// tests/cuda/bf16_backward_test.cpp (WarpSpecializedMatchesKeyOuter,
// GprojKeyOuterSinkLikeRowMass, GprojWideSecondPass).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_gproj_keys_kernel.cuh"
#include "kernels/cuda/bf16_keyouter_ws_kernel.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/setmaxnreg.cuh"
#include "kernels/cuda/tma.cuh"

namespace gaugewatch::gpu::bf16::gproj_keys_ws {

using hopper::kKvKeys;
using hopper::kKvRows;

// Stages of the ring: 3; 2 for 256-key blocks at D = 128 (shared memory).
template <int D, int kKeys>
inline constexpr int kRingStages = D == 128 && kKeys == kWideKeyBlockKeys ? 2 : 3;
// 64-key tiles per warpgroup (r, C).
template <int kKeys>
inline constexpr int kTilesPerWg = kKeys / kKvKeys;
inline constexpr int kProducerThreads = wgmma::kWarpgroupThreads;
inline constexpr int kComputeThreads = 2 * wgmma::kWarpgroupThreads;
inline constexpr int kThreads = kProducerThreads + kComputeThreads;
inline constexpr uint32_t kFullArrivals = 1 + 32;  // lane 0's expect_tx + every producer lane's rows
// Named barrier of the 256 compute threads (then keyouter::DqHandoff's, 5 ..).
inline constexpr int kComputeBarrier = 3;
static_assert(keyouter::DqHandoff::kFull > kComputeBarrier, "barrier ids");
// Blocks per SM as gproj_keys_kernel (its accumulators are C, D / 2
// registers, and S, 32); 256-key blocks: one (C and S of two tiles).
template <int D, int kKeys = kKvKeys>
inline constexpr int kBlocksPerSm = kKeys == kKvKeys ? gproj_keys::kBlocksPerSm<D> : 1;
// Whether -lambda U goes to dQacc through a staging tile and the writer warp
// (D = 128, and 256-key blocks at D = 64: keyouter::DqHandoff, the first
// pass's dQ hand-over) rather than by the compute threads' float4 atomics
// (gproj_keys::add_u). On the H200 (ncu, B4 H16 N4096 d128 causal) the
// atomics' register reads held the compute threads for 31% of the pass's
// stall samples. 128-key blocks at D = 64 run two blocks per SM, whose
// register pool has no room for the writer (the writer at one block per SM
// measured 1.158x there, kernels/cuda/README.md).
template <int D, int kKeys = kKvKeys>
inline constexpr bool kUWriter = D == 128 || kKeys == kWideKeyBlockKeys;
// With the writer at D = 128 the last tile's U is issued before its C, in a
// commit group of its own: -lambda U is staged and handed over while C's
// MMAs run (H100 A/B, 2026-12-05: the pass 0.95-0.96x at D = 128; at D = 64,
// 256 keys, 1.026x, so not there).
template <int D, int kKeys = kKvKeys>
inline constexpr bool kUFirst = kUWriter<D, kKeys> && D == 128;
// With the writer each warpgroup computes U's D / 2 columns D / 2 wg.. over
// all the block's keys (m64n64, at D = 64 m64n32), kUFloats accumulators;
// otherwise (D = 64, 128 keys) all 64 columns over its own keys.
template <int D, int kKeys = kKvKeys>
inline constexpr int kUFloats = kUWriter<D, kKeys> ? D / 4 : 32;
// D = 64: whether each warpgroup computes U over its own 64 keys only (4
// steps, not gproj_keys_kernel's 8 over all 128 keys in both warpgroups)
// and the two partials are summed through shared memory before the atomics
// (put_u_partial, add_u_partial): its r tile, free once its MMAs are done,
// holds the partial of the other warpgroup's 32 columns. The atomics stay
// as many as before (each warpgroup adds its 32 columns). On the H200 the
// pass took 0.934x its time with both warpgroups computing all of U (B4 H16
// N4096 d64 causal, 2026-12-03).
template <int D, int kKeys = kKvKeys>
inline constexpr bool kUSplitsKeys = D == 64 && kKeys == kKvKeys;

// The exchange tile of kUSplitsKeys: a warpgroup's [64 rows][64 keys] BF16 r
// tile read as FP32 [64 rows][32 columns], the 8-column groups of row r
// XOR-swizzled by r % 4 so that a warp's float2 stores and loads (rows g,
// columns 8 group + 2 c) hit distinct banks per half-warp.
__device__ __forceinline__ int u_partial_offset(int r, int group, int c) {
  return r * 32 + 8 * (group ^ (r & 3)) + 2 * c;
}

// This thread's partial U (all 64 columns, this warpgroup's keys) of the
// other warpgroup's columns (32 (1 - wg)..) into this warpgroup's exchange
// tile; the element choice by selects (registers indexed by constants).
__device__ __forceinline__ void put_u_partial(const float (&u)[32], float* mine, int row0, int g, int c, int wg) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = row0 + g + 8 * hh;
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) {
      const int other = 4 * (gi + 4) + 2 * hh, own = 4 * gi + 2 * hh;  // wg 0 gives columns 32.., wg 1 0..
      *reinterpret_cast<float2*>(mine + u_partial_offset(r, gi, c)) =
          wg == 0 ? make_float2(u[other], u[other + 1]) : make_float2(u[own], u[own + 1]);
    }
  }
}

// U of this warpgroup's 32 columns (32 wg..): its partial plus the other
// warpgroup's from that one's exchange tile (the same thread of the other
// warpgroup wrote this thread's elements), in u's places that
// gproj_keys::add_u reads at D = 64. A sum of two FP32 terms, so the same
// value in whichever order.
__device__ __forceinline__ void add_u_partial(float (&u)[32], const float* theirs, int row0, int g, int c, int wg) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = row0 + g + 8 * hh;
#pragma unroll
    for (int gi = 0; gi < 4; ++gi) {
      const float2 x = *reinterpret_cast<const float2*>(theirs + u_partial_offset(r, gi, c));
      const int lo = 4 * gi + 2 * hh, hi = 4 * (gi + 4) + 2 * hh;
      u[lo] += wg == 0 ? x.x : 0.0f;
      u[lo + 1] += wg == 0 ? x.y : 0.0f;
      u[hi] += wg == 0 ? 0.0f : x.x;
      u[hi + 1] += wg == 0 ? 0.0f : x.y;
    }
  }
}
// The block's register pool is what it launches with (65,536 / (384 x
// blocks per SM), rounded down to a multiple of 8: 168 at one block per SM,
// 80 at two), shared as producer + 2 x compute <= 3 x launch
// (setmaxnreg.cuh; more and setmaxnreg.inc waits forever).
template <int D, int kKeys = kKvKeys>
inline constexpr int kLaunchRegs = (65536 / (kThreads * kBlocksPerSm<D, kKeys>)) / 8 * 8;
// The writer warp's loop and reductions spill at 40 here (ptxas -v).
template <int D, int kKeys = kKvKeys>
inline constexpr int kProducerRegs = kUWriter<D, kKeys> ? 48 : 24;
template <int D, int kKeys = kKvKeys>
inline constexpr int kComputeRegs = ((3 * kLaunchRegs<D, kKeys> - kProducerRegs<D, kKeys>) / 2) / 8 * 8;
template <int D, int kKeys>
inline constexpr bool kFitsPool =
    kProducerRegs<D, kKeys> + 2 * kComputeRegs<D, kKeys> <= 3 * kLaunchRegs<D, kKeys>;
static_assert(kFitsPool<64, kKvKeys> && kFitsPool<128, kKvKeys> && kFitsPool<64, kWideKeyBlockKeys> &&
                  kFitsPool<128, kWideKeyBlockKeys>,
              "the block's register pool");

// The operands' maps; with the writer (kUWriter) also dQacc's, the
// destination of its tensor reductions.
struct Maps {
  tma::TensorMap q, neg_lambda_q, k, dq_accum;
};

// Shared memory (BF16 elements, offsets 1024-byte aligned): K (kKeys keys),
// per stage Q and bf16(-lambda Q) (64 rows each), two sets of r ([64
// rows][64 keys] per 64 keys of the block, in key order: warpgroup w's tile
// h is tile kTilesPerWg w + h), with the writer (kUWriter) the FP32 staging
// tile of -lambda U ([64 rows][D], tma::f32_tile_offset), per stage the rows'
// lse, first and end key and lambda, then the mbarriers full[kStages],
// empty[kStages], k_full. The slack: GAUGEWATCH_BF16_SMEM's array is
// 128-byte aligned, so wgmma::align_1024 skips at most 896 bytes (the
// 256-key layout at D = 128 takes 232,360 bytes with it, of the 232,448 a
// block may have).
template <int D, int kKeys = kKvKeys>
struct Layout {
  static constexpr int kStages = kRingStages<D, kKeys>;
  static constexpr int kRowTile = kKvRows * D;
  static constexpr int kK = 0;
  static constexpr int kStage0 = kKeys * D;  // Q of stage s at kStage0 + 2 s kRowTile, then its bf16(-lambda Q)
  static constexpr int kScoreTile = kKvRows * 64;
  static constexpr int kSetTiles = kKeys / 64;                 // r tiles per set
  static constexpr int kR = kStage0 + 2 * kStages * kRowTile;  // r tile t of set e: kR + (kSetTiles e + t) kScoreTile
  static constexpr int kStaging = kR + 2 * kSetTiles * kScoreTile;
  static constexpr int kStagingElements = kUWriter<D, kKeys> ? kKvRows * D * 2 : 0;  // BF16 elements
  static constexpr int kRows = kStaging + kStagingElements;
  static constexpr size_t kBarriers = static_cast<size_t>(kRows) * 2 + kStages * gproj_keys::kRowArrays * kKvRows * 4;
  static constexpr int kBarrierCount = 2 * kStages + 1;
  static constexpr size_t kAlignSlack = 1024 - 128;
  static constexpr size_t kBytes = kBarriers + kBarrierCount * sizeof(uint64_t) + kAlignSlack;
  static_assert(kStage0 % 512 == 0 && kRowTile % 512 == 0 && kScoreTile % 512 == 0, "tiles 1024-byte aligned");
  static_assert(kBarriers % 8 == 0, "mbarriers are 8-byte aligned");
  static_assert(kBytes <= 227 * 1024, "a block's shared memory (227 KiB on sm_90)");

  __host__ __device__ static constexpr int q(int s) { return kStage0 + 2 * s * kRowTile; }
  __host__ __device__ static constexpr int neg_lambda_q(int s) { return q(s) + kRowTile; }
  __host__ __device__ static constexpr int r_set(int set) { return kR + kSetTiles * set * kScoreTile; }
};

// The three maps for the operands of `a` (K in boxes of kKeys rows), or
// false where one cannot be encoded (the caller then runs
// gproj_keys_kernel).
template <int D, int kKeys = kKvKeys>
inline bool encode_maps(const Args& a, Maps* maps) {
  if (a.batch < 1 || a.hq < 1 || a.hkv < 1 || a.n < 1 || a.m < 1) return false;
  if (a.q_strides.batch < 0 || a.q_strides.head < 0 || a.k_strides.batch < 0 || a.k_strides.head < 0) return false;
  const OperandStrides dense{static_cast<int64_t>(a.hq) * a.n * D, static_cast<int64_t>(a.n) * D, D};
  const tma::EncodeStatus st[3] = {
      tma::encode_bf16_rows_map(&maps->q, keyouter_ws::rows_tensor<D>(a, a.q, a.hq, a.n, a.q_strides), kKvRows),
      tma::encode_bf16_rows_map(&maps->neg_lambda_q,
                                keyouter_ws::rows_tensor<D>(a, a.neg_lambda_q, a.hq, a.n, dense), kKvRows),
      tma::encode_bf16_rows_map(&maps->k, keyouter_ws::rows_tensor<D>(a, a.k, a.hkv, a.m, a.k_strides), kKeys)};
  for (const tma::EncodeStatus s : st) {
    if (s != tma::EncodeStatus::kOk) return false;
  }
  return !kUWriter<D, kKeys> || tma::encode_f32_reduce_map(&maps->dq_accum, keyouter::dq_accum_tensor<D>(a), kKvRows) ==
                             tma::EncodeStatus::kOk;
}

// Whether K's map in boxes of kKeys rows encodes for `a`: where the 128-key
// pass's maps encode, the condition for the kKeys-key pass to run (its
// other maps are those of the 128-key pass). Host code
// (gpu::gproj_pass2_block_keys).
template <int D, int kKeys>
inline bool key_map_encodable(const Args& a) {
  tma::TensorMap map{};
  return tma::encode_bf16_rows_map(&map, keyouter_ws::rows_tensor<D>(a, a.k, a.hkv, a.m, a.k_strides), kKeys) ==
         tma::EncodeStatus::kOk;
}

template <int D, int kKeys = kKvKeys>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<D, kKeys>)
    gproj_keys_ws_kernel(const __grid_constant__ Maps maps, const Args a) {
  static_assert(kKeys == kKvKeys || kKeys == kWideKeyBlockKeys, "128- or 256-key blocks");
  GAUGEWATCH_BF16_SMEM(raw);
  uint16_t* smem = wgmma::align_1024(raw);
  using L = Layout<D, kKeys>;
  constexpr int kStages = L::kStages;
  constexpr int kTiles = kTilesPerWg<kKeys>;
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(smem) + L::kBarriers);
  uint64_t* empty = full + kStages;
  uint64_t* k_full = empty + kStages;
  float* rows_base = reinterpret_cast<float*>(smem + L::kRows);
  [[maybe_unused]] float* staging = reinterpret_cast<float*>(smem + L::kStaging);
  const auto [j0, b, hk] = hopper::key_block<kKeys>(a);
  const RowTiles seen = tiles_seeing_keys(a, j0, kKeys, kKvRows);
  const int t_begin = seen.first, tiles = seen.count;
  const int iters = tiles * a.group;
  // The block's rows of dKacc (keys j0.. of (b, hk), those below M).
  const int64_t dk_rows_offset = ((static_cast<int64_t>(b) * a.hkv + hk) * a.m + j0) * D;
  const uint32_t dk_rows_bytes = static_cast<uint32_t>(a.m - j0 < kKeys ? a.m - j0 : kKeys) * D * 4;
  auto tile_row0 = [&](int it) { return (t_begin + it % tiles) * kKvRows; };
  auto head_of = [&](int it) { return hk * a.group + it / tiles; };

  if (threadIdx.x == 0) mbarrier::init_ring<kStages>(full, empty, kFullArrivals, kComputeThreads, k_full);
  __syncthreads();  // the barriers' init, before the roles part (the only block-wide barrier)

  if (threadIdx.x < kProducerThreads) {
    regs::setmaxnreg_dec<kProducerRegs<D, kKeys>>();
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    if constexpr (kUWriter<D, kKeys>) {
      if (warp == keyouter::DqHandoff::kWriterWarp) {
        keyouter::DqHandoff::writer_loop(iters, [&](int it) {
          keyouter::DqHandoff::add_tile<D>(&maps.dq_accum, b * a.hq + head_of(it), tile_row0(it), staging, lane);
        });
        return;
      }
    }
    if (warp != 0 || iters == 0) return;  // no iteration: nothing loaded, nothing in flight at exit
    if (lane == 0) {
      tma::prefetch(&maps.q);
      tma::prefetch(&maps.neg_lambda_q);
      mbarrier::arrive_expect_tx(k_full, tma::tile_bytes<kKeys, D>());
      tma::load_rows_tile<kKeys, D>(smem + L::kK, &maps.k, j0, hk, b, k_full);
    }
    for (int it = 0; it < iters; ++it) {
      const int s = it % kStages;
      const uint32_t round = static_cast<uint32_t>(it / kStages);
      mbarrier::wait(&empty[s], (round & 1u) ^ 1u);  // the compute threads are done with its last use
      const int i0 = tile_row0(it), h = head_of(it);
      if (lane == 0) {
        mbarrier::arrive_expect_tx(&full[s], 2 * tma::tile_bytes<kKvRows, D>());
        tma::load_rows_tile<kKvRows, D>(smem + L::q(s), &maps.q, i0, h, b, &full[s]);
        tma::load_rows_tile<kKvRows, D>(smem + L::neg_lambda_q(s), &maps.neg_lambda_q, i0, h, b, &full[s]);
        // The last tile: write_dk's dKacc rows, into L2 while the compute
        // threads finish (the block's tail has nothing else to hide them).
        if (it + 1 == iters) bulk::prefetch_l2(a.dk_accum + dk_rows_offset, dk_rows_bytes);
      }
      // The rows' inputs as gproj_keys_kernel stages them (rows past N: lse 0,
      // lambda 0 and an empty key range).
      const gproj_keys::StagedLse sr = gproj_keys::staged_lse(rows_base, s);
      const QueryHead qh = query_head(a, b, h);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = lane + 32 * half, row = i0 + r;
        const KeyRange kr = row_keys(a, row);
        sr.kb[r] = kr.begin;
        sr.ke[r] = kr.end;
        sr.lse[r] = row < a.n ? qh.lse[row] : 0.0f;
        sr.lambda[r] = row < a.n ? a.row_factor[qh.row_base + row] : 0.0f;
      }
      mbarrier::arrive(&full[s]);  // release: this lane's row writes
    }
    return;
  }

  regs::setmaxnreg_inc<kComputeRegs<D, kKeys>>();
  const int tid = static_cast<int>(threadIdx.x) - kProducerThreads;
  const int warp = tid >> 5, lane = tid & 31;
  const int wg = warp >> 2, v = warp & 3, g = lane >> 2, c = lane & 3;
  const int row0 = 16 * v;  // this warp's first query row of a tile / first key of its warpgroup's 64
  const int tile0 = kTiles * wg;  // this warpgroup's first 64-key tile of the block
  float acc[kTiles][D / 2];       // C of each of its tiles
#pragma unroll
  for (int h = 0; h < kTiles; ++h) hopper::zero(acc[h]);
  if (iters > 0) mbarrier::wait(k_full, 0);
  for (int it = 0; it < iters; ++it) {
    const int s = it % kStages;
    mbarrier::wait(&full[s], static_cast<uint32_t>(it / kStages) & 1u);
    const gproj_keys::StagedLse staged = gproj_keys::staged_lse(rows_base, s);
    gproj_keys::TileRows tr = gproj_keys::tile_rows(staged, row0, g);
    const int i0 = tile_row0(it);
    const int64_t row_base = query_head(a, b, head_of(it)).row_base;
    uint16_t* r_set = smem + L::r_set(it & 1);
    uint16_t* r_tile = r_set + tile0 * L::kScoreTile;  // this warpgroup's first

    // S of each tile, one commit group each, so that the first tile's r is
    // stored while the second's MMAs run; wide blocks then issue the first
    // tile's C (it reads only this warpgroup's r) while the second tile's r
    // is formed. Groups complete in order, so wait<kTiles - 1> finds S of
    // tile h done with at most the next group (S of tile 1, then C of tile
    // 0) in flight.
    float sc[kTiles][32];  // written by scores_mma (its first step does not read them)
    wgmma::fence();
#pragma unroll
    for (int h = 0; h < kTiles; ++h) {
      hopper::scores_mma<D, kKvRows, kKeys>(sc[h], smem + L::q(s), 0, smem + L::kK, 64 * (tile0 + h));
      wgmma::commit();
    }
#pragma unroll
    for (int h = 0; h < kTiles; ++h) {
      wgmma::wait<kTiles - 1>();
      wgmma::fence_operand(sc[h]);
      gproj_keys::store_r(a, sc[h], tr, j0 + 64 * (tile0 + h), row0, g, c, r_tile + h * L::kScoreTile);
      if (h + 1 < kTiles) {
        wgmma::fence_proxy_async();
        wgmma::warpgroup_barrier(1 + wg);  // this warpgroup's r rows of tile h, which its C reads
        wgmma::fence();
        gproj_keys::c_mma<D>(acc[h], r_tile + h * L::kScoreTile, smem + L::neg_lambda_q(s));
        wgmma::commit();
      }
    }
    wgmma::fence_proxy_async();
    if constexpr (kUSplitsKeys<D, kKeys>) {
      wgmma::warpgroup_barrier(1 + wg);  // the warpgroup's r rows, which its MMAs alone read
    } else {
      wgmma::named_barrier<kComputeThreads>(kComputeBarrier);  // U reads both warpgroups' r
    }

    // U in S's first registers (S is dead once r is stored).
    constexpr int kU = kUFloats<D, kKeys>;
    float(&u)[kU] = *reinterpret_cast<float(*)[kU]>(&sc[0][0]);
    if constexpr (kU != 32) hopper::zero(u);  // m64n32: the first step accumulates too
    wgmma::fence();
    if constexpr (kUFirst<D, kKeys>) {
      // U first, in a commit group of its own, then C of the last tile: the
      // -lambda U tile is staged and handed to the writer while C's MMAs
      // run, and stage s is released once they are done (C reads its
      // bf16(-lambda Q) tile).
      gproj_keys::u_mma<D, kUSplitsKeys<D, kKeys>, kKeys>(u, r_set, smem + L::kK, wg);
      wgmma::commit();
      gproj_keys::c_mma<D>(acc[kTiles - 1], r_tile + (kTiles - 1) * L::kScoreTile, smem + L::neg_lambda_q(s));
      wgmma::commit();
      wgmma::wait<1>();
      wgmma::fence_operand(u);
    } else {
      gproj_keys::c_mma<D>(acc[kTiles - 1], r_tile + (kTiles - 1) * L::kScoreTile, smem + L::neg_lambda_q(s));
      gproj_keys::u_mma<D, kUSplitsKeys<D, kKeys>, kKeys>(u, r_set, smem + L::kK, wg);
      wgmma::commit();
      wgmma::wait<0>();
#pragma unroll
      for (int h = 0; h < kTiles; ++h) wgmma::fence_operand(acc[h]);
      wgmma::fence_operand(u);
    }
    // Wide blocks: lambda read again here, so that it holds no registers
    // while S of both tiles and C are live (their peak; read with the other
    // rows it spilled).
    if constexpr (kTiles > 1) gproj_keys::tile_lambda(staged, row0, g, tr.lambda);
    if constexpr (!kUFirst<D, kKeys>) {
      mbarrier::arrive(&empty[s]);  // this thread's reads of stage s (its rows, and through the MMAs its tiles) are done
    }
    if constexpr (kUWriter<D, kKeys>) {
      keyouter::DqHandoff::acquire(it, wg);
      gproj_keys::stage_u<D>(u, tr, staging, row0, g, c, wg);
      keyouter::DqHandoff::release();
      if constexpr (kUFirst<D, kKeys>) {
        wgmma::wait<0>();
#pragma unroll
        for (int h = 0; h < kTiles; ++h) wgmma::fence_operand(acc[h]);
        mbarrier::arrive(&empty[s]);  // this thread's reads of stage s (its rows, and through the MMAs its tiles) are done
      }
    } else {
      if constexpr (kUSplitsKeys<D, kKeys>) {
        // The r tile is free: this warpgroup's MMAs, its only readers, are
        // done. The other warpgroup rewrites its own tile of this set two
        // iterations on, after the next compute barrier, which this
        // warpgroup reaches only once its reads below are done.
        wgmma::warpgroup_reads_done();
        put_u_partial(u, reinterpret_cast<float*>(r_tile), row0, g, c, wg);
        wgmma::named_barrier<kComputeThreads>(kComputeBarrier);
        add_u_partial(u, reinterpret_cast<const float*>(r_set + (1 - wg) * L::kScoreTile), row0, g, c, wg);
      }
      gproj_keys::add_u<D>(a, u, tr, row_base, i0, row0, g, c, wg);
    }
  }
  if constexpr (kTiles == 1) {
    gproj_keys::write_dk<D>(a, acc[0], j0 + 64 * tile0, b, hk, row0, g, c);
  } else {
    // The block's coordinates again (held across the loop beside C of two
    // tiles, they spilled).
    const hopper::KeyBlock kb = hopper::key_block<kKeys>(a, block_x_again());
#pragma unroll
    for (int h = 0; h < kTiles; ++h) {
      gproj_keys::write_dk<D>(a, acc[h], kb.j0 + 64 * (tile0 + h), kb.b, kb.hk, row0, g, c);
    }
  }
}

}  // namespace gaugewatch::gpu::bf16::gproj_keys_ws
