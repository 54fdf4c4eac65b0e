#pragma once
// Second pass of backend gproj on the key-outer path (Bf16BackwardParams::
// gproj_path; math: kernels/cuda/bf16_backward.h):
// dK'_j = alpha (sum_i t_ij q_i + sum_i r_ij bf16(-lambda_i q_i)) and
// dQ'_i = alpha (sum_j t_ij k_j - lambda_i sum_j r_ij k_j). The key-outer
// kernel (bf16_keyouter_kernel.cuh, P = kGproj) left dKacc_j = sum_i t_ij q_i
// in FP32 (dk_accum) and dQacc_i = sum_j t_ij k_j (dq_accum), and
// finish_rows_kernel lambda_i (row_factor) and the rows bf16(-lambda_i q_i)
// (neg_lambda_q); this kernel adds the second sums: C_j = sum_i r_ij
// bf16(-lambda_i q_i), rounded once into dK, and per key block and query
// tile -lambda_i U_i, U_i = sum_j r_ij k_j over the block's keys, into
// dQacc (finish_rows_kernel<D, kNone> then rounds dQ).
//
// gproj_keys_kernel: block = 128 keys of one (batch, kv head), two
// warpgroups (wg: keys 64 wg..), loop over the 64-row query tiles of every
// query head of the group that see the keys (tiles_seeing_keys, causal skip,
// cp.async double buffering, the order of the key-outer kernel):
//   S = Q K_wg^T                       ss, m64n64 (hopper::scores_mma: the
//                                      same instructions as the first pass)
//   r = bf16(P), P from the saved lse  hopper::probability, packed to BF16
//                                      (the first pass's r, bit for bit)
//   r -> shared [64 rows][64 keys], then a barrier of both warpgroups
//   (U reads both r tiles)
//   C += r^T bf16(-lambda Q)           ss, m64nD, A and B MN-major
//   U = r K over all 128 keys          ss, m64n64, A K-major, B = K MN-major:
//                                      D = 128 each warpgroup columns 64 wg..
//                                      (the first pass's dQ split); D = 64
//                                      both warpgroups all 64 columns (see
//                                      kUSplitsColumns)
//   dQacc += -lambda_i U               float4 atomics (lane pairs exchange
//                                      halves: one per four elements), as
//                                      many per tile as the first pass's dQ:
//                                      each warpgroup 64 columns (D = 128)
//                                      or 32, 32 wg.. (D = 64)
// 3 products per tile pair (the first pass 5: S, dP, dV, dK, dQ); at D = 64
// the tensor cores compute U twice, once per warpgroup (the
// warp-specialized pass instead sums two partials over half the keys each
// through shared memory, gproj_keys_ws::kUSplitsKeys).
// Then dK = bf16(alpha (dKacc + C)) (FP32 add, then the scale, then one
// rounding): given the first pass's dKacc and lambda, dK is bitwise
// repeatable; dQacc's sums land in atomic order.
//
// Layouts: operands and outputs as bf16_backward.h; workspace: dk_accum
// (B, Hkv, M, d) FP32, dq_accum (B, Hq, N, d) FP32, row_factor (lambda,
// (B, Hq, N) FP32), neg_lambda_q (B, Hq, N, d) BF16.
// Build: launched by bf16_keyouter_launch.cuh (gproj); emulation:
// tests/cuda/emulation/bf16_launcher.cpp. Tests: tests/cuda/bf16_backward_test.cpp
// (Bf16KeyOuterCase, GprojKeyOuter*).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_backward_hopper.cuh"
#include "kernels/cuda/tma.cuh"

namespace gaugewatch::gpu::bf16::gproj_keys {

using hopper::kKvKeys;
using hopper::kKvRows;
using hopper::kThreads;

// D = 64: two blocks per SM (C, D / 2 registers, and S, 32, are its only
// accumulators; 68 KB of shared memory); D = 128: one (116 KB).
template <int D>
inline constexpr int kBlocksPerSm = D == 64 ? 2 : 1;
inline constexpr int kRowArrays = 4;  // staged per query row: lse, first key, end key, lambda

// Shared memory (BF16 elements, offsets 1024-byte aligned): K (128 keys), two
// buffers of Q and bf16(-lambda Q) (64 rows each), r of each warpgroup
// ([64 rows][64 keys]), then per buffer the rows' lse, first and end key.
template <int D>
struct Layout {
  static constexpr int kRowTile = kKvRows * D;
  static constexpr int kK = 0;
  static constexpr int kQ0 = kKvKeys * D, kL0 = kQ0 + kRowTile, kQ1 = kL0 + kRowTile, kL1 = kQ1 + kRowTile;
  static constexpr int kScoreTile = kKvRows * 64;
  static constexpr int kR = kL1 + kRowTile;  // r of warpgroup w at kR + w kScoreTile
  static constexpr int kRows = kR + 2 * kScoreTile;
  static constexpr int kRowFloats = 2 * kRowArrays * kKvRows;
  static constexpr size_t kBytes = static_cast<size_t>(kRows) * 2 + kRowFloats * 4 + 1024;  // + alignment slack
};

struct StagedLse {
  float* lse;
  int* kb;
  int* ke;
  float* lambda;
};

__device__ __forceinline__ StagedLse staged_lse(float* base, int buf) {
  float* p = base + buf * kRowArrays * kKvRows;
  return {p, reinterpret_cast<int*>(p + kKvRows), reinterpret_cast<int*>(p + 2 * kKvRows), p + 3 * kKvRows};
}

// The per-tile work both second passes share (gproj_keys_kernel below and
// the warp-specialized gproj_keys_ws_kernel, bf16_gproj_keys_ws_kernel.cuh),
// for the warpgroup of this thread (warp = tid / 32 of the 256 compute
// threads, wg = warp / 4 owning keys j0 + 64 wg..).
struct TileRows {
  int kb[2], ke[2];
  float lse_log2[2];
  float lambda[2];
};

// lambda of this thread's two rows of a staged query tile (as tile_rows
// reads it).
__device__ __forceinline__ void tile_lambda(const StagedLse& ra, int row0, int g, float (&lambda)[2]) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) lambda[hh] = ra.lambda[row0 + g + 8 * hh];
}

// This thread's two rows (g, g + 8 of its warp's 16) of a staged query tile.
__device__ __forceinline__ TileRows tile_rows(const StagedLse& ra, int row0, int g) {
  TileRows tr;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = row0 + g + 8 * hh;
    tr.kb[hh] = ra.kb[r];
    tr.ke[hh] = ra.ke[r];
    tr.lse_log2[hh] = ra.lse[r] * kLog2e;  // as hopper::staged_row_inputs
    tr.lambda[hh] = ra.lambda[r];
  }
  return tr;
}

// The cp.async loads of the query tile of head h at rows i0.. into q_dst
// and lq_dst (Q and bf16(-lambda Q), [64][D] each) and of its rows' lse and
// lambda (the visible key range by plain stores) into buffer `buf` of the
// staged rows at rows_base (rows past N: zeros and an empty key range).
// Every thread of the block takes part, threads 0 .. 63 stage the rows;
// the caller commits. gproj_keys_kernel's and the head-dim-256 second
// pass's loads (bf16_gproj_keys_d256_kernel.cuh).
template <int D>
__device__ __forceinline__ void load_query_tile(const Args& a, int b, int h, int i0, uint16_t* q_dst,
                                                uint16_t* lq_dst, float* rows_base, int buf) {
  const QueryHead qh = query_head(a, b, h);
  hopper::load_rows<kKvRows, D>(q_dst, qh.q, a.q_strides.row, i0, a.n);
  hopper::load_rows<kKvRows, D>(lq_dst, a.neg_lambda_q + qh.row_base * D, D, i0, a.n);
  if (threadIdx.x < kKvRows) {
    const StagedLse sr = staged_lse(rows_base, buf);
    const int r = threadIdx.x, row = i0 + r;
    const bool ok = row < a.n;
    const KeyRange kr = row_keys(a, row);
    sr.kb[r] = kr.begin;
    sr.ke[r] = kr.end;
    mma::cp_async_4(sr.lse + r, qh.lse + (ok ? row : 0), ok);
    mma::cp_async_4(sr.lambda + r, a.row_factor + qh.row_base + (ok ? row : 0), ok);
  }
}

// r = bf16(P) of the scores s into this warpgroup's [64 rows][64 keys] tile
// (keys j_base + 8 jn + 2 c + e, as hopper::scores_to_tr). A warp whose
// rows all see the warpgroup's 64 keys takes the loop without the
// per-element visibility test (hopper::for_each_tile_element), as
// scores_to_tr does: the same FFMA and ex2 on every visible element, so the
// same bits.
__device__ __forceinline__ void store_r(const Args& a, float (&s)[32], const TileRows& tr, int j_base, int row0, int g,
                                        int c, uint16_t* r_tile) {
  auto element = [&](int i, auto test) {
    const int half = (i >> 1) & 1;
    const int j = hopper::element_key(j_base, c, i);
    const bool visible = !decltype(test)::value || (j >= tr.kb[half] && j < tr.ke[half]);
    s[i] = hopper::probability(a, s[i], tr.lse_log2[half], visible);
  };
  hopper::for_each_tile_element(tr.kb, tr.ke, j_base, element);
  static_assert(kKvRows == 64, "wgmma::store_accumulator_tile writes [64 rows][64 keys] tiles");
  wgmma::store_accumulator_tile(r_tile, s, row0 / 16, 4 * g + c);
}

// C += r^T bf16(-lambda Q): the warpgroup's r tile (MN-major A: keys x rows)
// against the tile's bf16(-lambda q) rows (MN-major B), 4 steps over the
// 64 rows (issued, committed and waited for by the caller).
template <int D>
__device__ __forceinline__ void c_mma(float (&acc)[D / 2], const uint16_t* r_tile, const uint16_t* lqs) {
  constexpr uint32_t kSubTile = kKvRows * 64 * 2;  // bytes between a row tile's 64-column blocks
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int step = wgmma::chunk_offset<kKvRows>(16 * k, 0);  // rows 16 k.. of every [64][*] tile
    wgmma::mma_ss<true, true>(acc, wgmma::desc_mn_major(r_tile, step, kSubTile),
                              wgmma::desc_mn_major(lqs, step, kSubTile));
  }
}

// Whether each warpgroup computes 64 of U's columns (D = 128), or both all
// 64 (D = 64) and each adds half. At D = 64 the alternatives cost more, on
// the H200: each warpgroup its own keys' partial doubles the atomics, which
// then bound the pass (1.13 ms against 0.46 ms without U, B4 H16 N4096
// causal), unless the partials are summed in shared memory first (the
// warp-specialized pass, gproj_keys_ws::kUSplitsKeys: 0.934x); U in
// alternate iterations by one warpgroup puts wgmma behind a branch, and
// ptxas serializes every wgmma of the kernel (C7520); an
// m64n32 split would start the MN-major, 128-byte swizzled K operand in
// the middle of its rows.
template <int D>
inline constexpr bool kUSplitsColumns = D == 128;

// U = r K, this warpgroup's 64 columns (kUSplitsColumns: 64 wg..) over the
// block's kKeys keys: r of keys 64 t.. at r_tiles + t [64 rows][64 keys]
// (K-major A), K the block's [kKeys keys][D] tile (MN-major B); kKeys / 16
// steps (issued, committed and waited for by the caller; the first step's
// scale-d 0 needs no zeroing). kOwnKeys (D = 64, the warp-specialized pass):
// all 64 columns over this warpgroup's 64 keys only, 4 steps, a partial that
// the caller sums with the other warpgroup's (gproj_keys_ws::kUSplitsKeys).
// kFloats = 16 (D = 64, the warp-specialized pass over 256 keys): columns
// 32 wg.. by m64n32 steps (B starts 64 bytes into K's swizzled rows for
// warpgroup 1, as the first pass's dQ at D = 64), every step accumulating
// (the caller zeroes u).
template <int D, bool kOwnKeys = false, int kKeys = kKvKeys, int kFloats>
__device__ __forceinline__ void u_mma(float (&u)[kFloats], const uint16_t* r_tiles, const uint16_t* k_tile, int wg) {
  static_assert(!kOwnKeys || (D == 64 && kKeys == kKvKeys), "own keys: all of U's 64 columns");
  static_assert(kFloats == 32 || (kFloats == 16 && D == 64 && !kOwnKeys), "m64n64, or m64n32 columns at D = 64");
  constexpr int kScoreTile = kKvRows * 64;
  constexpr uint32_t kKeySubTile = kKeys * 64 * 2;  // bytes between the K tile's 64-column blocks
#pragma unroll
  for (int kk = 0; kk < (kOwnKeys ? 4 : kKeys / 16); ++kk) {
    const int k = kOwnKeys ? 4 * wg + kk : kk;  // keys 16 k.. of the block
    const uint64_t r_desc =
        wgmma::desc_k_major(r_tiles, (k >> 2) * kScoreTile + wgmma::chunk_offset<kKvRows>(0, 2 * (k & 3)));
    const int column_chunk = kFloats == 16 ? 4 * wg : (kUSplitsColumns<D> ? 8 * wg : 0);
    const uint64_t k_desc =
        wgmma::desc_mn_major(k_tile, wgmma::chunk_offset<kKeys>(16 * k, column_chunk), kKeySubTile);
    if constexpr (kFloats == 32) {
      if (kk == 0) {
        wgmma::mma_ss_first<false, true>(u, r_desc, k_desc);
      } else {
        wgmma::mma_ss<false, true>(u, r_desc, k_desc);
      }
    } else {
      wgmma::mma_ss<false, true>(u, r_desc, k_desc);
    }
  }
}

// dQacc_i += -lambda_i U_i for this thread's rows g, g + 8 of the query tile
// at i0 (row0 + g: its warp's rows) and its U columns (D = 128: its 64, at
// 64 wg; D = 64: 32 wg.. of the 64 it holds), by float4 atomics: lanes c and
// c ^ 1 hold columns 2 c, 2 c + 1 of rows g and g + 8 in each 8-column
// group jn; the even lane adds row g's four columns, the odd lane row
// g + 8's, each taking its partner's pair by one exchange. The scale is one
// FP32 multiply per element (negation exact). Rows past N add nothing.
template <int D>
__device__ __forceinline__ void add_u(const Args& a, const float (&u)[32], const TileRows& tr, int64_t row_base,
                                      int i0, int row0, int g, int c, int wg) {
  constexpr int kGroups = kUSplitsColumns<D> ? 8 : 4;  // 8-column groups this warpgroup adds
  const bool odd = (c & 1) != 0;
  const int row = i0 + row0 + g + (odd ? 8 : 0);
  const float neg_lambda = -(odd ? tr.lambda[1] : tr.lambda[0]);
  const int col0 = kUSplitsColumns<D> ? 64 * wg : 32 * wg;
  float* dst = a.dq_accum + (row_base + row) * D + col0 + 2 * (c & ~1);
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) {
    // Group jn of u: gi, or at D = 64 warpgroup 1's gi + 4 (selects: the
    // registers are indexed by constants).
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = kUSplitsColumns<D> || wg == 0 ? u[4 * gi + e] : u[4 * (gi + 4) + e];
    const float keep0 = odd ? v[2] : v[0], keep1 = odd ? v[3] : v[1];
    const float give0 = odd ? v[0] : v[2], give1 = odd ? v[1] : v[3];
    const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
    const float got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
    if (row < a.n) {
      const float4 x = odd ? make_float4(got0, got1, keep0, keep1) : make_float4(keep0, keep1, got0, got1);
      atomicAdd(reinterpret_cast<float4*>(dst + 8 * gi),
                make_float4(neg_lambda * x.x, neg_lambda * x.y, neg_lambda * x.z, neg_lambda * x.w));
    }
  }
}

// The warp-specialized pass with the writer warp (gproj_keys_ws::kUWriter:
// D = 128, and D = 64 over 256-key blocks): -lambda_i U_i of this thread's
// rows g, g + 8 and its warpgroup's D / 2 U columns (D / 2 wg..) into the
// FP32 staging tile ([64 rows][D] in tma::f32_tile_offset's swizzled
// layout), which the writer warp adds to dQacc by tensor reductions; the
// same FP32 product per element as add_u (rows past N are staged and not
// added).
template <int D>
__device__ __forceinline__ void stage_u(const float (&u)[D / 4], const TileRows& tr, float* staging, int row0, int g,
                                        int c, int wg) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float neg_lambda = -tr.lambda[hh];
    const int x = tma::f32_tile_offset<kKvRows>(row0 + g + 8 * hh, D / 2 * wg + 2 * c);
#pragma unroll
    for (int jn = 0; jn < D / 16; ++jn) {
      *reinterpret_cast<float2*>(staging + tma::f32_tile_step<kKvRows>(x, jn)) =
          make_float2(neg_lambda * u[4 * jn + 2 * hh], neg_lambda * u[4 * jn + 2 * hh + 1]);
    }
  }
}

// dK = bf16(alpha (dKacc + C)) of this thread's two keys of the
// warpgroup's 64 keys key0.., columns col0 .. col0 + kCols - 1 (C's m64n
// kCols fragment: all D columns, or the head-dim-256 pass's 128 of the
// warpgroup); keys past M are not written.
template <int D, int kCols = D>
__device__ __forceinline__ void write_dk(const Args& a, const float (&acc)[kCols / 2], int key0, int b, int hk,
                                         int row0, int g, int c, int col0 = 0) {
  const int64_t key_base = (static_cast<int64_t>(b) * a.hkv + hk) * a.m;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = key0 + row0 + g + 8 * hh;
    if (key >= a.m) continue;
    const float* dka = a.dk_accum + (key_base + key) * D;
    uint16_t* dko = output_row(a.dk, a.dk_strides, b, hk, key);
#pragma unroll
    for (int jn = 0; jn < kCols / 8; ++jn) {
      const int col = col0 + 8 * jn + 2 * c;
      const float2 x = *reinterpret_cast<const float2*>(dka + col);
      *reinterpret_cast<uint32_t*>(dko + col) =
          mma::pack_bf16(a.scale * (x.x + acc[4 * jn + 2 * hh]), a.scale * (x.y + acc[4 * jn + 2 * hh + 1]));
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<D>) gproj_keys_kernel(const Args a) {
  GAUGEWATCH_BF16_SMEM(raw);
  uint16_t* smem = wgmma::align_1024(raw);
  using L = Layout<D>;
  const auto [j0, b, hk] = hopper::key_block(a);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wg = warp >> 2, v = warp & 3, g = lane >> 2, c = lane & 3;
  const int row0 = 16 * v;  // this warp's first query row of a tile / first key of its warpgroup's 64

  const KeyHead kh = key_head(a, b, hk);
  float* rows_base = reinterpret_cast<float*>(smem + L::kRows);
  uint16_t* r_tile = smem + L::kR + wg * L::kScoreTile;

  const RowTiles seen = tiles_seeing_keys(a, j0, kKvKeys, kKvRows);
  const int t_begin = seen.first, tiles = seen.count;
  const int iters = tiles * a.group;
  auto tile_row0 = [&](int it) { return (t_begin + it % tiles) * kKvRows; };
  auto head_of = [&](int it) { return hk * a.group + it / tiles; };

  hopper::load_rows<kKvKeys, D>(smem + L::kK, kh.k, a.k_strides.row, j0, a.m);

  // Loads of iteration `it` (query head, query tile) into buffer `buf`.
  auto stage = [&](int it, int buf) {
    load_query_tile<D>(a, b, head_of(it), tile_row0(it), smem + (buf ? L::kQ1 : L::kQ0),
                       smem + (buf ? L::kL1 : L::kL0), rows_base, buf);
  };
  if (iters > 0) stage(0, 0);
  mma::cp_async_commit();

  float acc[D / 2];
  hopper::zero(acc);

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    // This iteration's loads arrive; both warpgroups are done with iteration
    // it - 1's buffers (each waited for its MMAs), which the next loads reuse.
    hopper::publish_buffer(false);
    if (it + 1 < iters) {
      stage(it + 1, buf ^ 1);
      mma::cp_async_commit();
    }
    const uint16_t* qs = smem + (buf ? L::kQ1 : L::kQ0);
    const uint16_t* lqs = smem + (buf ? L::kL1 : L::kL0);
    const TileRows tr = tile_rows(staged_lse(rows_base, buf), row0, g);
    const int i0 = tile_row0(it);
    const int64_t row_base = query_head(a, b, head_of(it)).row_base;

    float s[32];  // written by scores_mma (its first step does not read them)
    if (wg == 1) wgmma::pingpong_wait(hopper::kPingpongBarrier);
    wgmma::fence();
    hopper::scores_mma<D, kKvRows, kKvKeys>(s, qs, 0, smem + L::kK, 64 * wg);
    wgmma::commit();
    if (wg == 0) wgmma::pingpong_arrive(hopper::kPingpongBarrier);
    wgmma::wait<0>();
    wgmma::fence_operand(s);

    store_r(a, s, tr, j0 + 64 * wg, row0, g, c, r_tile);
    wgmma::fence_proxy_async();
    __syncthreads();  // U reads both warpgroups' r

    float (&u)[32] = s;  // S is dead once r is stored
    wgmma::fence();
    c_mma<D>(acc, r_tile, lqs);
    u_mma<D>(u, smem + L::kR, smem + L::kK, wg);
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operand(acc);
    wgmma::fence_operand(u);
    add_u<D>(a, u, tr, row_base, i0, row0, g, c, wg);
  }
  mma::cp_async_wait<0>();
  write_dk<D>(a, acc, j0 + 64 * wg, b, hk, row0, g, c);
}

}  // namespace gaugewatch::gpu::bf16::gproj_keys
