#pragma once
// The mma.sync kernel pair of the fused BF16 backward, kept only as the
// measured baseline of the Hopper pair (bf16_backward_hopper.cuh; the
// benchmark times both, Bf16KernelPair::kMmaSyncBaseline selects this one).
// Math, layouts and the choice of structure: kernels/cuda/bf16_backward.h.
// Tensor cores through mma.sync m16n8k16 (kernels/cuda/bf16_mma.cuh), cp.async
// double buffering, XOR-swizzled shared tiles.
//
// Both main kernels run 8 warps on a 64-row x 64-key tile pair:
//   phase 1 ("scores"): warp w takes rows 16 (w % 4).. and keys 32 (w / 4)..,
//     computes S = Q K^T and dP = dO V^T (MMA), P, t = bf16(dS), r = bf16(P),
//     and stores t and r to shared memory. This code is shared verbatim by
//     both kernels: every element of S is the same sequence of MMAs over the
//     head dim, so t and r are bit-identical in the two kernels.
//   phase 2 ("contract"): the dq kernel's warp w owns rows 16 (w % 4).. and
//     head-dim half w / 4 of dQ (and U = r K for gproj); the dkdv kernel's warp
//     w owns keys 16 (w % 4).. and head-dim half w / 4 of dK and dV.
// Head dim 256 (the only kernels of the fused backward that take it; the
// Hopper pair's and the key-outer kernels' tiles do not fit there): the same
// code at D / 2 = 128 columns per warp in phase 2 (dQ, U, dK and dV of 16 x
// 128 FP32 each, 64 registers), one block per SM, and gproj's dkdv kernel
// single-buffers Q / dO beside its -lambda Q tile (kDoubleBufferQ).
// Build: launched through baseline/bf16_mma_sync_launch.cuh from the
// instantiations bf16_backward_d{64,128,256}_{none,gproj,pivot}.cu.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_backward_common.cuh"

namespace gaugewatch::gpu::bf16::mma_sync {


inline constexpr int kWarps = 8;
inline constexpr int kThreads = kWarps * 32;
inline constexpr int kBr = 64;  // query rows per tile
inline constexpr int kBc = 64;  // keys per tile
// Occupancy configuration of one kernel: B blocks of 8 warps per SM that the
// register allocation (and shared memory) must allow. Each kernel of the pair
// takes its own B (dq_kernel<D, P, BQ>, dkdv_kernel<D, P, BKV>). B = 1 keeps
// the loops fully unrolled and double-buffers Q/dO in the dkdv kernel
// (~220 registers at D = 128); B = 2 at D = 128 unrolls less and single-
// buffers Q/dO, to fit 128 registers and half the shared memory, so two
// blocks overlap each other's barriers. D = 64 fits 128 registers fully
// unrolled.
template <int D, int B>
struct Occupancy {
  static_assert(B == 1 || B == 2, "one or two blocks per SM");
  static_assert(D != 256 || B == 1, "head dim 256: one block per SM (dK and dV alone take 128 registers)");
  static constexpr int kPhase1Unroll = (D == 128 && B == 2) ? 2 : D / 16;
  static constexpr int kContractUnroll = (D == 128 && B == 2) ? 1 : kBc / 16;
  static constexpr bool kDoubleBufferQ = !(D == 128 && B == 2);
};

// Whether the dkdv kernel double-buffers Q / dO: as Occupancy says, except
// gproj at D = 256, whose six 32 KiB tiles (K, V, two Q / dO buffers, -lambda
// Q) would not fit the 227 KiB a block may have.
template <int D, Projection P, int B>
inline constexpr bool kDoubleBufferQ = Occupancy<D, B>::kDoubleBufferQ && !(D == 256 && P == Projection::kGproj);

// Blocks per SM of the dq and dkdv kernels by default: two wherever the kernel
// fits 128 registers without spilling. gproj at D = 128 runs one block in both
// kernels: the dq kernel's second accumulator U = r K does not fit, and the
// dkdv kernel (its -lambda Q operand in shared memory) spills 28 bytes at 128
// registers (still 8 with the -lambda Q staging loop kept rolled; nvcc 13.0).
// D = 256: one block (a dq block's tiles take 208 KiB).
template <int D, Projection P>
struct DefaultBlocks {
  static constexpr int kDq = D == 256 || (D == 128 && P == Projection::kGproj) ? 1 : 2;
  static constexpr int kDkdv = kDq;
};

// Copies rows [row0, row0 + 64) of a (rows, D) BF16 matrix into a swizzled
// shared tile; rows past `rows` are zero-filled.
template <int D>
__device__ __forceinline__ void load_tile_async(uint16_t* dst, const uint16_t* src, int64_t row_stride, int row0,
                                                int rows) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int idx = threadIdx.x; idx < kBr * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = row0 + r < rows;
    const uint16_t* from = src + (valid ? static_cast<int64_t>(row0 + r) * row_stride + c * 8 : 0);
    mma::cp_async_16(dst + mma::swz<D>(r, c), from, valid);
  }
}

// Phase 1 on one warp: S and dP for 16 rows x 32 keys (keys key0.. of the
// tile, absolute index j0 + key0 + ...), then P, t, r; t and r go to the
// swizzled [64][64] tiles ts/rs. `visit(half, nt, e, j, p, t, r, s)` sees
// every element (half: row g or g + 8) for the row statistics.
template <int D, int kUnroll, class Visit>
__device__ __forceinline__ void scores_phase(const Args& a, const uint16_t* qs, const uint16_t* gos, const uint16_t* ks,
                                             const uint16_t* vs, uint16_t* ts, uint16_t* rs, int row0, int key0,
                                             int j0, const RowInputs& in, Visit&& visit) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  constexpr int kNt = 4;  // 32 keys = 4 n-tiles of 8
  float s[kNt][4], dp[kNt][4];
#pragma unroll
  for (int i = 0; i < kNt; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.0f;

  const int a_row = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_chunk = lane >> 4;
  const int b_row = key0 + (lane & 7) + (lane >> 4) * 8;
  const int b_chunk = (lane >> 3) & 1;
#pragma unroll kUnroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t fa[4], fo[4];
    mma::ldmatrix_x4(fa, qs + mma::swz<D>(a_row, kk * 2 + a_chunk));
    mma::ldmatrix_x4(fo, gos + mma::swz<D>(a_row, kk * 2 + a_chunk));
#pragma unroll
    for (int np = 0; np < kNt / 2; ++np) {
      uint32_t fk[4], fv[4];
      mma::ldmatrix_x4(fk, ks + mma::swz<D>(b_row + np * 16, kk * 2 + b_chunk));
      mma::ldmatrix_x4(fv, vs + mma::swz<D>(b_row + np * 16, kk * 2 + b_chunk));
      mma::mma_bf16(s[2 * np], fa, fk[0], fk[1]);
      mma::mma_bf16(s[2 * np + 1], fa, fk[2], fk[3]);
      mma::mma_bf16(dp[2 * np], fo, fv[0], fv[1]);
      mma::mma_bf16(dp[2 * np + 1], fo, fv[2], fv[3]);
    }
  }

#pragma unroll
  for (int nt = 0; nt < kNt; ++nt) {
    float tv[4], rv[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e >> 1;
      const int j = j0 + key0 + nt * 8 + 2 * c + (e & 1);
      const bool visible = j >= in.kb[half] && j < in.ke[half];
      // exp2(s alpha log2e - lse log2e) as FlashAttention forms it; a select,
      // not a multiply, for masked keys, so NaN or Inf in padding never leaks.
      const float p = visible ? mma::exp2_approx(fmaf(s[nt][e], a.scale_log2, -in.lse_log2[half])) : 0.0f;
      const float t = visible ? mma::round_bf16(p * (dp[nt][e] - in.delta[half])) : 0.0f;
      const float r = mma::round_bf16(p);
      tv[e] = t;
      rv[e] = r;
      visit(half, j, visible, p, t, r, s[nt][e]);
    }
    const int col_chunk = (key0 + nt * 8) / 8;
    const int rlo = row0 + g, rhi = row0 + g + 8;
    *reinterpret_cast<uint32_t*>(ts + mma::swz<kBc>(rlo, col_chunk) + 2 * c) = mma::pack_bf16(tv[0], tv[1]);
    *reinterpret_cast<uint32_t*>(ts + mma::swz<kBc>(rhi, col_chunk) + 2 * c) = mma::pack_bf16(tv[2], tv[3]);
    *reinterpret_cast<uint32_t*>(rs + mma::swz<kBc>(rlo, col_chunk) + 2 * c) = mma::pack_bf16(rv[0], rv[1]);
    *reinterpret_cast<uint32_t*>(rs + mma::swz<kBc>(rhi, col_chunk) + 2 * c) = mma::pack_bf16(rv[2], rv[3]);
  }
}

// acc[16 x D/2] += X Y where X is 16 rows x 64 (from a [64][64] tile, rows
// row0.., non-transposed, or its transpose: rows = columns key0.. of the tile)
// and Y is 64 x D/2 (rows of a [64][D] tile, columns d0..).
template <int D, bool kTransX, int kUnroll = kBc / 16>
__device__ __forceinline__ void contract(float (&acc)[D / 16][4], const uint16_t* x, const uint16_t* y, int row0,
                                         int d0) {
  const int lane = threadIdx.x & 31;
  constexpr int kNt = D / 16;  // n-tiles of 8 in D/2 columns
#pragma unroll kUnroll
  for (int kc = 0; kc < kBc / 16; ++kc) {
    uint32_t fx[4];
    if constexpr (kTransX) {
      // A = X^T: stored rows are the contraction index.
      const int srow = kc * 16 + (lane & 7) + (lane >> 4) * 8;
      const int schunk = (row0 >> 3) + ((lane >> 3) & 1);
      mma::ldmatrix_x4_trans(fx, x + mma::swz<kBc>(srow, schunk));
    } else {
      const int srow = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
      const int schunk = kc * 2 + (lane >> 4);
      mma::ldmatrix_x4(fx, x + mma::swz<kBc>(srow, schunk));
    }
    const int yrow = kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int np = 0; np < kNt / 2; ++np) {
      uint32_t fy[4];
      mma::ldmatrix_x4_trans(fy, y + mma::swz<D>(yrow, (d0 >> 3) + np * 2 + (lane >> 4)));
      mma::mma_bf16(acc[2 * np], fx, fy[0], fy[1]);
      mma::mma_bf16(acc[2 * np + 1], fx, fy[2], fy[3]);
    }
  }
}

// acc1 += X1 Y and acc2 += X2 Y in one sweep (X non-transposed): GProj's dQ
// and U = r K share every fragment of K, loaded once.
template <int D, int kUnroll = kBc / 16>
__device__ __forceinline__ void contract_pair(float (&acc1)[D / 16][4], const uint16_t* x1, float (&acc2)[D / 16][4],
                                              const uint16_t* x2, const uint16_t* y, int row0, int d0) {
  const int lane = threadIdx.x & 31;
  constexpr int kNt = D / 16;
#pragma unroll kUnroll
  for (int kc = 0; kc < kBc / 16; ++kc) {
    uint32_t f1[4], f2[4];
    const int srow = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
    const int schunk = kc * 2 + (lane >> 4);
    mma::ldmatrix_x4(f1, x1 + mma::swz<kBc>(srow, schunk));
    mma::ldmatrix_x4(f2, x2 + mma::swz<kBc>(srow, schunk));
    const int yrow = kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int np = 0; np < kNt / 2; ++np) {
      uint32_t fy[4];
      mma::ldmatrix_x4_trans(fy, y + mma::swz<D>(yrow, (d0 >> 3) + np * 2 + (lane >> 4)));
      mma::mma_bf16(acc1[2 * np], f1, fy[0], fy[1]);
      mma::mma_bf16(acc1[2 * np + 1], f1, fy[2], fy[3]);
      mma::mma_bf16(acc2[2 * np], f2, fy[0], fy[1]);
      mma::mma_bf16(acc2[2 * np + 1], f2, fy[2], fy[3]);
    }
  }
}

template <int D>
__device__ __forceinline__ void zero(float (&acc)[D / 16][4]) {
#pragma unroll
  for (int i = 0; i < D / 16; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
}

// Shared memory of the dq kernel (BF16 elements): Q, dO, two K/V buffers, t, r.
template <int D>
struct DqSmem {
  static constexpr int kTile = kBr * D;
  static constexpr int kQ = 0, kGo = kTile, kK0 = 2 * kTile, kV0 = 3 * kTile, kK1 = 4 * kTile, kV1 = 5 * kTile;
  static constexpr int kT = 6 * kTile, kR = kT + kBr * kBc;
  // Row-statistic partials, float [2 halves][64 rows][8], reuse t and r after
  // the key loop (16 KiB less keeps two blocks per SM at D = 128).
  static constexpr int kStats = kT;
  static constexpr size_t kBytes = static_cast<size_t>(kR + kBr * kBc) * 2;
  static_assert(2 * kBr * 8 * sizeof(float) <= 2 * kBr * kBc * 2, "statistics must fit the t and r tiles");
};

template <int D, Projection P, int B>
__global__ void __launch_bounds__(kThreads, B) dq_kernel(const Args a) {
  GAUGEWATCH_BF16_SMEM(smem);
  using L = DqSmem<D>;
  const int tiles = (a.n + kBr - 1) / kBr;
  const int tile = a.causal != 0 ? tiles - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y;
  const int b = bh / a.hq, h = bh % a.hq, hk = h / a.group;
  const int i0 = tile * kBr;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int rg = warp & 3, half = warp >> 2;  // row group; key half (phase 1) / head-dim half (phase 2)
  const int row0 = rg * 16;

  const QueryHead qh = query_head(a, b, h);
  const KeyHead kh = key_head(a, b, hk);
  const int64_t row_base = static_cast<int64_t>(bh) * a.n;  // qh.row_base, from blockIdx (no register to keep)

  const RowInputs in = row_inputs(a, i0 + row0, qh.lse, row_base);
  // Key tiles: from the first row's first visible key to the last row's end.
  const int last_row = (i0 + kBr < a.n ? i0 + kBr : a.n) - 1;
  const int j_begin = row_keys(a, i0).begin / kBc * kBc;
  const int j_end = row_keys(a, last_row).end;

  load_tile_async<D>(smem + L::kQ, qh.q, a.q_strides.row, i0, a.n);
  load_tile_async<D>(smem + L::kGo, qh.grad_out, a.grad_out_strides.row, i0, a.n);
  if (j_begin < j_end) {
    load_tile_async<D>(smem + L::kK0, kh.k, a.k_strides.row, j_begin, a.m);
    load_tile_async<D>(smem + L::kV0, kh.v, a.v_strides.row, j_begin, a.m);
  }
  mma::cp_async_commit();

  float dq[D / 16][4], u[D / 16][4];
  zero<D>(dq);
  if constexpr (P == Projection::kGproj) zero<D>(u);
  // Row statistics of this warp's key half, for its rows g and g + 8.
  RowStats row_stats;
  // Row diagnostics are written by the bf16 variant only (validate() refuses
  // them elsewhere): the other variants keep those registers free.
  const bool want_diag = P == Projection::kNone && a.diag.any();

  int buf = 0;
  for (int j0 = j_begin; j0 < j_end; j0 += kBc) {
    if (j0 + kBc < j_end) {
      load_tile_async<D>(smem + (buf ? L::kK0 : L::kK1), kh.k, a.k_strides.row, j0 + kBc, a.m);
      load_tile_async<D>(smem + (buf ? L::kV0 : L::kV1), kh.v, a.v_strides.row, j0 + kBc, a.m);
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
    } else {
      mma::cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* ks = smem + (buf ? L::kK1 : L::kK0);
    const uint16_t* vs = smem + (buf ? L::kV1 : L::kV0);
    scores_phase<D, Occupancy<D, B>::kPhase1Unroll>(a, smem + L::kQ, smem + L::kGo, ks, vs, smem + L::kT, smem + L::kR, row0, half * 32, j0, in,
                    [&](int hh, int j, bool visible, float p, float t, float r, float s) {
                      if (want_diag) {
                        row_stats.add<true, true>(hh, j, visible, p, t, r, a.scale * s);
                      } else {
                        row_stats.add<false, P == Projection::kPivot>(hh, j, visible, p, t, r, a.scale * s);
                      }
                    });
    __syncthreads();
    if constexpr (P == Projection::kGproj) {
      // Unrolled by 2 at D = 64: fully unrolled, the shared sweep spills at
      // 128 registers; rolled at D = 256, where dQ and U take 128 of 255.
      constexpr int kUnroll = D == 64 ? 2 : D == 256 ? 1 : Occupancy<D, B>::kContractUnroll;
      contract_pair<D, kUnroll>(dq, smem + L::kT, u, smem + L::kR, ks, row0, half * (D / 2));
    } else {
      contract<D, false, Occupancy<D, B>::kContractUnroll>(dq, smem + L::kT, ks, row0, half * (D / 2));
    }
    __syncthreads();
    buf ^= 1;
  }
  mma::cp_async_wait<0>();

  // Reduce the row statistics over the 4 lanes of a row (fixed xor order),
  // then over the two key halves through shared memory (half 0 + half 1).
  float* stats = reinterpret_cast<float*>(smem + L::kStats);  // [2 halves][64 rows][8]
  row_stats.reduce_quad();
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    if (c == 0) {
      float* st = stats + (half * kBr + row0 + g + 8 * hh) * 8;
      st[0] = row_stats.rho[hh];
      st[1] = row_stats.mass[hh];
      st[2] = row_stats.abs_rho[hh];
      st[3] = row_stats.pmax[hh];
      st[4] = __int_as_float(row_stats.parg[hh]);
      st[5] = row_stats.lmax[hh];
    }
  }
  __syncthreads();
  // Combined statistics of this thread's two rows (both halves).
  float lam[2], rho_row[2];
  int jstar[2];
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float* s0 = stats + (row0 + g + 8 * hh) * 8;
    const float* s1 = stats + (kBr + row0 + g + 8 * hh) * 8;
    rho_row[hh] = s0[0] + s1[0];
    const float m_row = s0[1] + s1[1];
    lam[hh] = m_row > 0.0f ? rho_row[hh] / m_row : 0.0f;
    const int a0 = __float_as_int(s0[4]), a1 = __float_as_int(s1[4]);
    // Half 0 holds the lower keys of every tile, but a later tile's half 0
    // can beat an earlier tile's half 1: compare values, ties to the lower j.
    if (a1 >= 0 && (a0 < 0 || s1[3] > s0[3] || (s1[3] == s0[3] && a1 < a0))) {
      jstar[hh] = a1;
    } else {
      jstar[hh] = a0;
    }
  }

  // dQ' = alpha (dQacc - correction), rounded once to BF16.
  const int d0 = half * (D / 2);
  const int bh_out = block_y_again();  // (b, h) again: no register held across the key loop
  uint16_t* const dq_head = head_ptr(a.dq, a.dq_strides, bh_out / a.hq, bh_out % a.hq);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = i0 + row0 + g + 8 * hh;
    if (row >= a.n) continue;
    const int64_t orow = row_base + row;
    uint16_t* out = dq_head + static_cast<int64_t>(row) * a.dq_strides.row;
    const uint16_t* kstar = (P == Projection::kPivot && jstar[hh] >= 0) ? kh.k + jstar[hh] * a.k_strides.row : nullptr;
#pragma unroll
    for (int nt = 0; nt < D / 16; ++nt) {
      const int col = d0 + nt * 8 + 2 * c;
      float x0 = dq[nt][2 * hh], x1 = dq[nt][2 * hh + 1];
      if constexpr (P == Projection::kGproj) {
        x0 -= lam[hh] * u[nt][2 * hh];
        x1 -= lam[hh] * u[nt][2 * hh + 1];
      } else if constexpr (P == Projection::kPivot) {
        if (kstar != nullptr) {
          x0 -= rho_row[hh] * mma::bf16_bits_to_float(kstar[col]);
          x1 -= rho_row[hh] * mma::bf16_bits_to_float(kstar[col + 1]);
        }
      }
      *reinterpret_cast<uint32_t*>(out + col) = mma::pack_bf16(a.scale * x0, a.scale * x1);
    }
    // One thread per row writes the per-row outputs.
    if (half == 0 && c == 0) {
      if constexpr (P == Projection::kGproj) a.row_factor[orow] = lam[hh];
      if constexpr (P == Projection::kPivot) {
        a.row_factor[orow] = rho_row[hh];
        a.pivot_key[orow] = jstar[hh];
      }
      if (want_diag) {
        const float* s0 = stats + (row0 + g + 8 * hh) * 8;
        const float* s1 = stats + (kBr + row0 + g + 8 * hh) * 8;
        if (a.diag.row_mass) a.diag.row_mass[orow] = rho_row[hh];
        if (a.diag.prob_mass) a.diag.prob_mass[orow] = s0[1] + s1[1];
        if (a.diag.abs_row_mass) a.diag.abs_row_mass[orow] = s0[2] + s1[2];
        if (a.diag.p_max) a.diag.p_max[orow] = fmaxf(fmaxf(s0[3], s1[3]), 0.0f);
        if (a.diag.logit_abs_max) a.diag.logit_abs_max[orow] = fmaxf(s0[5], s1[5]);
        if (a.diag.pivot) a.diag.pivot[orow] = jstar[hh];
      }
    }
  }
}

// Shared memory of the dkdv kernel (BF16 elements): K, V, one or two Q/dO
// buffers, -lambda Q (gproj), t, r; then per-row arrays for two buffers.
template <int D, Projection P, bool kDB>
struct DkdvSmem {
  static constexpr int kTile = kBr * D;
  static constexpr int kK = 0, kV = kTile, kQ0 = 2 * kTile, kG0 = 3 * kTile;
  static constexpr int kQ1 = kDB ? 4 * kTile : kQ0, kG1 = kDB ? 5 * kTile : kG0;  // aliases when single
  static constexpr int kLq = (kDB ? 6 : 4) * kTile;
  static constexpr int kT = kLq + (P == Projection::kGproj ? kTile : 0), kR = kT + kBr * kBc;
  static constexpr int kRows = kR + kBr * kBc;  // float [2 buffers][7][64]
  static constexpr int kRowFloats = 2 * 7 * kBr;
  static constexpr size_t kBytes = static_cast<size_t>(kRows + kRowFloats * 2) * 2;
};

// Row arrays of one query tile in the dkdv kernel.
struct RowArrays {
  float* lse_log2;
  float* delta;
  float* row_factor;  // lambda or rho
  int* pivot_key;     // j*
  int* kb;
  int* ke;
  unsigned* hits;  // pivot: bit r set when row r's j* is in this key tile (2 words)
};

__device__ __forceinline__ RowArrays row_arrays(float* base, int buf) {
  float* p = base + buf * 7 * kBr;
  return {p, p + kBr, p + 2 * kBr, reinterpret_cast<int*>(p + 3 * kBr), reinterpret_cast<int*>(p + 4 * kBr),
          reinterpret_cast<int*>(p + 5 * kBr), reinterpret_cast<unsigned*>(p + 6 * kBr)};
}

template <int D, Projection P, int B>
__global__ void __launch_bounds__(kThreads, B) dkdv_kernel(const Args a) {
  GAUGEWATCH_BF16_SMEM(smem);
  constexpr bool kDB = kDoubleBufferQ<D, P, B>;
  using L = DkdvSmem<D, P, kDB>;
  // Key tile 0 has the most query rows under causal masking: it goes first.
  const int ktile = static_cast<int>(blockIdx.x);
  const int bhk = blockIdx.y;
  const int b = bhk / a.hkv, hk = bhk % a.hkv;
  const int j0 = ktile * kBc;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, c = lane & 3;
  const int rg = warp & 3, half = warp >> 2;
  const int row0 = rg * 16;

  const KeyHead kh = key_head(a, b, hk);
  float* rows_base = reinterpret_cast<float*>(smem + L::kRows);

  const RowTiles seen = tiles_seeing_keys(a, j0, kBc, kBr);
  const int t_begin = seen.first, tiles = seen.count;
  const int iters = tiles * a.group;

  load_tile_async<D>(smem + L::kK, kh.k, a.k_strides.row, j0, a.m);
  load_tile_async<D>(smem + L::kV, kh.v, a.v_strides.row, j0, a.m);

  // Issues the loads of iteration `it` (query head, query tile) into buffer `buf`.
  auto stage = [&](int it, int buf) {
    const int h = hk * a.group + it / tiles;
    const int i0 = (t_begin + it % tiles) * kBr;
    load_tile_async<D>(smem + (buf ? L::kQ1 : L::kQ0), head_ptr(a.q, a.q_strides, b, h), a.q_strides.row, i0, a.n);
    load_tile_async<D>(smem + (buf ? L::kG1 : L::kG0), head_ptr(a.grad_out, a.grad_out_strides, b, h),
                       a.grad_out_strides.row, i0, a.n);
    const RowArrays ra = row_arrays(rows_base, buf);
    // After the loads: the lse pointer and row base stay out of their registers.
    const QueryHead qh = query_head(a, b, h);
    const int64_t row_base = qh.row_base;
    for (int r = threadIdx.x; r < kBr; r += kThreads) {
      const int row = i0 + r;
      const KeyRange kr = row_keys(a, row);
      const bool ok = row < a.n;
      ra.kb[r] = kr.begin;
      ra.ke[r] = kr.end;
      ra.lse_log2[r] = ok && kr.end > kr.begin ? qh.lse[row] * kLog2e : 0.0f;
      ra.delta[r] = ok ? a.delta[row_base + row] : 0.0f;
      if constexpr (P != Projection::kNone) ra.row_factor[r] = ok ? a.row_factor[row_base + row] : 0.0f;
      if constexpr (P == Projection::kPivot) {
        const int js = ok ? a.pivot_key[row_base + row] : -1;
        ra.pivot_key[r] = js;
        // Threads 0..63 are warps 0 and 1, whole: one ballot word each.
        const unsigned word = __ballot_sync(0xffffffffu, js >= j0 && js < j0 + kBc);
        if ((threadIdx.x & 31) == 0) ra.hits[threadIdx.x >> 5] = word;
      }
    }
  };
  if (kDB && iters > 0) stage(0, 0);
  mma::cp_async_commit();

  float dk[D / 16][4], dv[D / 16][4];
  zero<D>(dk);
  zero<D>(dv);

  for (int it = 0; it < iters; ++it) {
    const int buf = kDB ? (it & 1) : 0;
    if (!kDB) {
      // Single buffer: the previous iteration's closing barrier freed it.
      stage(it, 0);
      mma::cp_async_commit();
      mma::cp_async_wait<0>();
    } else if (it + 1 < iters) {
      stage(it + 1, buf ^ 1);
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
    } else {
      mma::cp_async_wait<0>();
    }
    __syncthreads();
    const uint16_t* qs = smem + (buf ? L::kQ1 : L::kQ0);
    const uint16_t* gos = smem + (buf ? L::kG1 : L::kG0);
    const RowArrays ra = row_arrays(rows_base, buf);

    if constexpr (P == Projection::kGproj) {
      // bf16(-lambda_i q_i): GEMM 7 then accumulates into dK with the sign
      // folded in (negation is exact in BF16).
      uint16_t* lq = smem + L::kLq;
      for (int idx = threadIdx.x; idx < kBr * (D / 2); idx += kThreads) {
        const int r = idx / (D / 2), cc = (idx % (D / 2)) * 2;
        const int off = mma::swz<D>(r, cc >> 3) + (cc & 7);
        const float lam = ra.row_factor[r];
        const uint32_t qq = *reinterpret_cast<const uint32_t*>(qs + off);
        const float q0 = mma::bf16_bits_to_float(static_cast<uint16_t>(qq & 0xffffu));
        const float q1 = mma::bf16_bits_to_float(static_cast<uint16_t>(qq >> 16));
        *reinterpret_cast<uint32_t*>(lq + off) = mma::pack_bf16(-lam * q0, -lam * q1);
      }
    }

    RowInputs in;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = row0 + g + 8 * hh;
      in.kb[hh] = ra.kb[r];
      in.ke[hh] = ra.ke[r];
      in.lse_log2[hh] = ra.lse_log2[r];
      in.delta[hh] = ra.delta[r];
    }
    scores_phase<D, Occupancy<D, B>::kPhase1Unroll>(a, qs, gos, smem + L::kK, smem + L::kV, smem + L::kT, smem + L::kR, row0, half * 32, j0, in,
                    [](int, int, bool, float, float, float, float) {});
    __syncthreads();
    contract<D, true, Occupancy<D, B>::kContractUnroll>(dv, smem + L::kR, gos, row0, half * (D / 2));
    contract<D, true, Occupancy<D, B>::kContractUnroll>(dk, smem + L::kT, qs, row0, half * (D / 2));
    if constexpr (P == Projection::kGproj) {
      contract<D, true, Occupancy<D, B>::kContractUnroll>(dk, smem + L::kR, smem + L::kLq, row0, half * (D / 2));
    }
    if constexpr (P == Projection::kPivot) {
      // dKacc_j -= rho_i q_i for the rows i of this query tile whose pivot
      // j = j*(i) is in this key tile, straight into the accumulator: key
      // j - j0 = 16 w' + 8 hh + g' lives in warps w' and w' + 4 (one head-dim
      // half each), lanes 4 g'.. 4 g' + 3, fragment elements 2 hh and
      // 2 hh + 1 of every n-tile. Each element is owned by one thread and
      // the flagged rows are visited in increasing i: deterministic, and the
      // same order in every occupancy variant (an explicit FMA, so the CPU
      // emulation rounds as the GPU does). Only the rows flagged at staging
      // are visited (usually none or a few, all 64 in the tile holding an
      // attention sink). No FP32 [64][D] shared tile: two blocks fit per SM.
      for (uint64_t left = ra.hits[0] | (static_cast<uint64_t>(ra.hits[1]) << 32); left != 0; left &= left - 1) {
        const int r = __ffsll(static_cast<long long>(left)) - 1;
        const int js = ra.pivot_key[r] - j0;
        if ((js >> 4) != rg || (js & 7) != g) continue;
        const int hh = (js >> 3) & 1;
        const float neg_rho = -ra.row_factor[r];
#pragma unroll
        for (int nt = 0; nt < D / 16; ++nt) {
          const int col = half * (D / 2) + nt * 8 + 2 * c;
          const uint32_t qq = *reinterpret_cast<const uint32_t*>(qs + mma::swz<D>(r, col >> 3) + (col & 7));
          const float q0 = mma::bf16_bits_to_float(static_cast<uint16_t>(qq & 0xffffu));
          const float q1 = mma::bf16_bits_to_float(static_cast<uint16_t>(qq >> 16));
          // Constant fragment indices (a runtime index would move dk to local memory).
          if (hh == 0) {
            dk[nt][0] = fmaf(neg_rho, q0, dk[nt][0]);
            dk[nt][1] = fmaf(neg_rho, q1, dk[nt][1]);
          } else {
            dk[nt][2] = fmaf(neg_rho, q0, dk[nt][2]);
            dk[nt][3] = fmaf(neg_rho, q1, dk[nt][3]);
          }
        }
      }
    }
    __syncthreads();
  }
  mma::cp_async_wait<0>();

  // dK = bf16(alpha dKacc), dV = bf16(dVacc) (pivot's fix-up already in dKacc).
  // Keys past M are not written.
  const int d0 = half * (D / 2);
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int kl = row0 + g + 8 * hh;
    const int key = j0 + kl;
    if (key >= a.m) continue;
    uint16_t* dko = output_row(a.dk, a.dk_strides, b, hk, key);
    uint16_t* dvo = output_row(a.dv, a.dv_strides, b, hk, key);
#pragma unroll
    for (int nt = 0; nt < D / 16; ++nt) {
      const int col = d0 + nt * 8 + 2 * c;
      *reinterpret_cast<uint32_t*>(dko + col) = mma::pack_bf16(a.scale * dk[nt][2 * hh], a.scale * dk[nt][2 * hh + 1]);
      *reinterpret_cast<uint32_t*>(dvo + col) = mma::pack_bf16(dv[nt][2 * hh], dv[nt][2 * hh + 1]);
    }
  }
}

}  // namespace gaugewatch::gpu::bf16::mma_sync
