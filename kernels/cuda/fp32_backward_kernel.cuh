#pragma once
// Kernel bodies of the fused FP32 attention backward (math and layouts:
// kernels/cuda/fp32_backward.h). Plain FP32 FFMA on CUDA cores: no tensor
// cores, since TF32 would round the operands.
// Build: instantiated per head dim in fp32_backward_d{64,128,256}.cu (target
// gaugewatch_cuda, sm_90a; `nvcc -Xptxas -v` for registers, spills are errors).
// Run: build/bin/gaugewatch_cuda_tests on an sm_90 GPU; the same source also
// runs on the CPU under tests/cuda/emulation (gaugewatch_cuda_emulation_tests).
//
// Tiling (per (batch, head); `Cfg` fixes head dim D and tile sizes):
//   row kernel,  grid (ceil(R / Br), S):   one query tile of Br chosen rows.
//     Pass A over the tile's key tiles: S = Q K^T and dP = dO V^T (Br x Bc),
//     online row max m, sum l = sum_j exp(s - m) and sum_j exp(s - m) dP;
//     writes m, l and delta = sum_j p dP / l to the workspace. P is later
//     exp(s - m) / l, not exp(s - lse): with |s| ~ 1e4, lse = m + log l
//     rounds to ~1e-3 absolute, which would scale the row's P, and its
//     gradients, by up to ~1e-3 relative.
//     Pass B (deterministic mode only): dQ = sum over key tiles of dS K_j in
//     registers, one plain store per element.
//   dkdv kernel, grid (ceil(M / Bc), B * Hkv): one key tile, K and V on chip.
//     Loops over the group's query heads and their query tiles (tiles no row of
//     which sees a key of this tile are skipped): P and dS from the saved row
//     statistics, dV += P^T dO, dK += dS^T Q in registers; in the default mode
//     dQ += dS K by FP32 atomics (float4 atomicAdd, sm_90).
// Shared memory: Q, dO (Br x (D + 4)), K, V (Bc x (D + 4)), P, dS (Br x (Bc + 4)),
// padded so that float4 reads along D are bank-conflict free.
// Threads: 256. Score tiles: thread (ty, tx) = (tid / 16, tid % 16) owns rows
// ty + 16 a and columns tx + 16 b. Accumulator tiles (rows x D): thread
// (tc, tk) = (tid / TK, tid % TK) owns consecutive rows tc * RPT + a and the
// float4 columns 4 tk + 4 TK b.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/fp32_backward.h"
#include "kernels/cuda/masking.cuh"

namespace gaugewatch::gpu::detail {

inline constexpr int kThreads = 256;

// Everything the kernels read, flattened (int64 where products can overflow).
struct Args {
  const float* q;
  const float* k;
  const float* v;
  const float* dout;
  float* dq;
  float* dk;
  float* dv;
  float* row_max;      // (S, R) workspace: m = max_j alpha s_ij
  float* row_sum;      // (S, R) workspace: l = sum_j exp(alpha s_ij - m)
  float* delta;        // (S, R) workspace
  const float* mu;     // (B, Hkv, D) workspace, or null: no key centering
  const int32_t* cu_q;  // (segments + 1) or null
  const int32_t* cu_k;
  const int32_t* slices;  // (S) or null: full mode
  const int32_t* rows;    // (R) or null: full mode
  int64_t batch;
  int64_t hq;
  int64_t hkv;
  int64_t n;
  int64_t m;
  int64_t num_slices;  // S
  int64_t num_rows;    // R
  int num_segments;
  int causal;          // CausalMode
  AttentionMask mask;  // attn_mask, on top of causal masking and packing
  float scale;
  bool dq_atomic;      // dkdv kernel adds dQ by atomics
  bool dq_in_rows;     // row kernel computes dQ (deterministic mode)
};

template <int D, int BR, int BC>
struct Config {
  static constexpr int kD = D;
  static constexpr int kBr = BR;
  static constexpr int kBc = BC;
  static constexpr int kLd = D + 4;        // row stride of Q, dO, K, V in shared memory
  static constexpr int kLdp = BC + 4;      // row stride of P, dS
  static constexpr int kRa = BR / 16;      // score rows per thread
  static constexpr int kCb = BC / 16;      // score columns per thread
  static constexpr int kTk = D / 4 < 32 ? D / 4 : 32;  // threads along D (float4 each)
  static constexpr int kKv4 = D / (4 * kTk);           // float4 columns per thread
  static constexpr int kTc = kThreads / kTk;           // threads along rows
  static constexpr int kCpt = BC / kTc;                // dK/dV rows per thread
  static constexpr int kRpt = BR / kTc;                // dQ rows per thread
  static_assert(D % 32 == 0, "padding argument assumes D multiple of 32");
  static_assert(BR % 16 == 0 && BC % 16 == 0, "score tiles are 16 x 16 threads");
  static_assert(kThreads % kTk == 0 && kCpt >= 4 && kCpt % 4 == 0 && kRpt >= 1,
                "accumulator layout needs float4 reads of P and dS");
  // Shared memory in floats: Q, dO, K, V, P, dS, m, l, delta, row begin, row
  // end, and the rows' attn_mask offsets (int64: two floats each, 8-byte
  // aligned since every count before them is even).
  static constexpr int kSmemFloats = 2 * BR * kLd + 2 * BC * kLd + 2 * BR * kLdp + 5 * BR + 2 * BR;
  static constexpr size_t kSmemBytes = sizeof(float) * static_cast<size_t>(kSmemFloats);
};

// Tile sizes per head dim: shared memory Q, dO, K, V, P, dS must fit one SM
// (227 KB); dK and dV stay in registers (Bc * D * 2 / 256 floats per thread).
template <int D> struct TileConfig;
template <> struct TileConfig<64> { using type = Config<64, 64, 64>; };    // 103 KiB shared
template <> struct TileConfig<128> { using type = Config<128, 64, 64>; };  // 167 KiB
template <> struct TileConfig<256> { using type = Config<256, 32, 32>; };  // 140 KiB

// Hopper: at most 227 KiB of shared memory per block.
inline constexpr size_t kMaxSmemPerBlock = 227 * 1024;

// alpha * s, rounded once: the one place a logit is scaled. __fmul_rn is never
// contracted into an FMA, so the pre-pass (row max, sum, delta) and the main
// pass see the same bits of every logit. With |alpha s| ~ 1e4 one ulp is ~1e-3:
// a logit that rounds differently in the two passes changes its P by ~1e-3
// relative, gives the row a nonzero sum of dS, and leaks the mean key into dQ.
__device__ __forceinline__ float scale_logit(float scale, float s) { return __fmul_rn(scale, s); }

// alpha * s + bias (attn_mask's additive bias, 0 without one), rounded the
// same way in every pass for the same reason.
__device__ __forceinline__ float masked_logit(float scale, float s, float bias) {
  return __fadd_rn(scale_logit(scale, s), bias);
}

// The block's dynamic shared memory. A macro so that the CPU emulation
// (tests/cuda/emulation/cuda_runtime.h) can supply its own block storage.
#ifndef GAUGEWATCH_DYNAMIC_SMEM
#define GAUGEWATCH_DYNAMIC_SMEM(name) extern __shared__ float4 name[]
#endif

// visible_keys() of kernels/reference/attention_problem.cpp on the device.
__device__ inline KeyRange visible_keys(const Args& a, int64_t row) {
  return gpu::visible_keys(a.cu_q, a.cu_k, a.num_segments, a.n, a.m, a.causal, row);
}

// Slice s -> flat b * Hq + h, or -1 when a chosen slice is out of range.
__device__ inline int64_t slice_flat(const Args& a, int64_t s) {
  if (a.slices == nullptr) return s;
  const int64_t flat = a.slices[s];
  return (flat >= 0 && flat < a.batch * a.hq) ? flat : -1;
}

// Row-list index -> row along N, or -1 when out of range.
__device__ inline int64_t row_of(const Args& a, int64_t ri) {
  if (ri >= a.num_rows) return -1;
  const int64_t n = a.rows == nullptr ? ri : a.rows[ri];
  return (n >= 0 && n < a.n) ? n : -1;
}

// dst[r][0..D) = src_row(r)[0..D) - mu (zeros where src_row(r) is null).
template <class Cfg, int ROWS, class RowPtr>
__device__ inline void load_tile(float* dst, RowPtr src_row, const float* mu) {
  constexpr int kVec = Cfg::kD / 4;
  for (int idx = threadIdx.x; idx < ROWS * kVec; idx += kThreads) {
    const int r = idx / kVec, c4 = idx % kVec;
    const float* src = src_row(r);
    float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
    if (src != nullptr) {
      val = __ldg(reinterpret_cast<const float4*>(src) + c4);
      if (mu != nullptr) {
        const float4 off = __ldg(reinterpret_cast<const float4*>(mu) + c4);
        val.x -= off.x;
        val.y -= off.y;
        val.z -= off.z;
        val.w -= off.w;
      }
    }
    *reinterpret_cast<float4*>(dst + r * Cfg::kLd + 4 * c4) = val;
  }
}

// acc[a][b] = sum_k A[ty + 16 a][k] * B[tx + 16 b][k] over the head dim.
template <class Cfg>
__device__ inline void tile_dot(const float* A, const float* B, float (&acc)[Cfg::kRa][Cfg::kCb],
                                int ty, int tx) {
#pragma unroll
  for (int i = 0; i < Cfg::kRa; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kCb; ++j) acc[i][j] = 0.f;
#pragma unroll 4
  for (int kk = 0; kk < Cfg::kD; kk += 4) {
    float4 x[Cfg::kRa], y[Cfg::kCb];
#pragma unroll
    for (int i = 0; i < Cfg::kRa; ++i)
      x[i] = *reinterpret_cast<const float4*>(A + (ty + 16 * i) * Cfg::kLd + kk);
#pragma unroll
    for (int j = 0; j < Cfg::kCb; ++j)
      y[j] = *reinterpret_cast<const float4*>(B + (tx + 16 * j) * Cfg::kLd + kk);
#pragma unroll
    for (int i = 0; i < Cfg::kRa; ++i)
#pragma unroll
      for (int j = 0; j < Cfg::kCb; ++j) {
        float t = acc[i][j];
        t = fmaf(x[i].x, y[j].x, t);
        t = fmaf(x[i].y, y[j].y, t);
        t = fmaf(x[i].z, y[j].z, t);
        t = fmaf(x[i].w, y[j].w, t);
        acc[i][j] = t;
      }
  }
}

// acc[a][b] += sum_r Left[r][tc * ROWS + a] * Right[r][4 tk + 4 TK b .. +4]
// over `inner` rows r: Left is (inner x kLdp) in shared memory (P or dS),
// Right is (inner x kLd) (dO or Q). Gives P^T dO and dS^T Q.
template <class Cfg, int ROWS>
__device__ inline void accumulate_transposed(const float* left, const float* right,
                                             float4 (&acc)[ROWS][Cfg::kKv4], int tc, int tk) {
#pragma unroll 2
  for (int r = 0; r < Cfg::kBr; ++r) {
    float p[ROWS];
#pragma unroll
    for (int a4 = 0; a4 < ROWS / 4; ++a4) {
      const float4 t = *reinterpret_cast<const float4*>(left + r * Cfg::kLdp + tc * ROWS + 4 * a4);
      p[4 * a4 + 0] = t.x;
      p[4 * a4 + 1] = t.y;
      p[4 * a4 + 2] = t.z;
      p[4 * a4 + 3] = t.w;
    }
#pragma unroll
    for (int b = 0; b < Cfg::kKv4; ++b) {
      const float4 y = *reinterpret_cast<const float4*>(right + r * Cfg::kLd + 4 * tk + 4 * Cfg::kTk * b);
#pragma unroll
      for (int a = 0; a < ROWS; ++a) {
        acc[a][b].x = fmaf(p[a], y.x, acc[a][b].x);
        acc[a][b].y = fmaf(p[a], y.y, acc[a][b].y);
        acc[a][b].z = fmaf(p[a], y.z, acc[a][b].z);
        acc[a][b].w = fmaf(p[a], y.w, acc[a][b].w);
      }
    }
  }
}

// acc[a][b] += sum_c dS[tc * RPT + a][c] * K[c][4 tk + 4 TK b .. +4]: dS K.
template <class Cfg>
__device__ inline void accumulate_dq(const float* ds, const float* k_tile,
                                     float4 (&acc)[Cfg::kRpt][Cfg::kKv4], int tc, int tk) {
#pragma unroll 2
  for (int c = 0; c < Cfg::kBc; ++c) {
    float4 y[Cfg::kKv4];
#pragma unroll
    for (int b = 0; b < Cfg::kKv4; ++b)
      y[b] = *reinterpret_cast<const float4*>(k_tile + c * Cfg::kLd + 4 * tk + 4 * Cfg::kTk * b);
#pragma unroll
    for (int a = 0; a < Cfg::kRpt; ++a) {
      const float g = ds[(tc * Cfg::kRpt + a) * Cfg::kLdp + c];
#pragma unroll
      for (int b = 0; b < Cfg::kKv4; ++b) {
        acc[a][b].x = fmaf(g, y[b].x, acc[a][b].x);
        acc[a][b].y = fmaf(g, y[b].y, acc[a][b].y);
        acc[a][b].z = fmaf(g, y[b].z, acc[a][b].z);
        acc[a][b].w = fmaf(g, y[b].w, acc[a][b].w);
      }
    }
  }
}

// Shared-memory carve-up, identical in both kernels.
template <class Cfg>
struct Smem {
  float* q;
  float* dout;
  float* k;
  float* v;
  float* p;
  float* ds;
  float* row_max;
  float* row_sum;
  float* delta;
  int* row_begin;
  int* row_end;
  int64_t* mask_row;  // mask_row_offset() of each row of the query tile
  __device__ explicit Smem(float* base) {
    q = base;
    dout = q + Cfg::kBr * Cfg::kLd;
    k = dout + Cfg::kBr * Cfg::kLd;
    v = k + Cfg::kBc * Cfg::kLd;
    p = v + Cfg::kBc * Cfg::kLd;
    ds = p + Cfg::kBr * Cfg::kLdp;
    row_max = ds + Cfg::kBr * Cfg::kLdp;
    row_sum = row_max + Cfg::kBr;
    delta = row_sum + Cfg::kBr;
    row_begin = reinterpret_cast<int*>(delta + Cfg::kBr);
    row_end = row_begin + Cfg::kBr;
    mask_row = reinterpret_cast<int64_t*>(row_end + Cfg::kBr);
  }
};

// P and dS of one (query tile, key tile) pair from the scores, written to
// shared memory: P = exp(alpha s + bias - m) / l on visible pairs the mask
// allows, dS = alpha P (dP - delta).
template <class Cfg>
__device__ inline void softmax_grad_tile(const Smem<Cfg>& sm, const float (&s)[Cfg::kRa][Cfg::kCb],
                                         const float (&dp)[Cfg::kRa][Cfg::kCb], int64_t j0,
                                         float scale, const AttentionMask& mask, int ty, int tx, bool store_p) {
#pragma unroll
  for (int i = 0; i < Cfg::kRa; ++i) {
    const int r = ty + 16 * i;
    const float row_max = sm.row_max[r], row_sum = sm.row_sum[r], delta = sm.delta[r];
    const int64_t begin = sm.row_begin[r], end = sm.row_end[r], mask_row = sm.mask_row[r];
#pragma unroll
    for (int j = 0; j < Cfg::kCb; ++j) {
      const int c = tx + 16 * j;
      const int64_t key = j0 + c;
      const bool visible = key >= begin && key < end && mask_allows(mask, mask_row, key);
      const float p =
          visible ? expf(masked_logit(scale, s[i][j], mask_bias(mask, mask_row, key)) - row_max) / row_sum : 0.f;
      if (store_p) sm.p[r * Cfg::kLdp + c] = p;
      sm.ds[r * Cfg::kLdp + c] = scale * (p * (dp[i][j] - delta));
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1) fp32_backward_rows_kernel(const Args a) {
  GAUGEWATCH_DYNAMIC_SMEM(smem_raw);
  const Smem<Cfg> sm(reinterpret_cast<float*>(smem_raw));
  __shared__ int key_lo, key_hi;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int tc = tid / Cfg::kTk, tk = tid % Cfg::kTk;
  const int64_t s = blockIdx.y;
  const int64_t ri0 = static_cast<int64_t>(blockIdx.x) * Cfg::kBr;
  const int64_t flat = slice_flat(a, s);
  const int64_t b = flat < 0 ? 0 : flat / a.hq, h = flat < 0 ? 0 : flat % a.hq;
  const int64_t hk = h / (a.hq / a.hkv);
  const float* q_head = a.q + (b * a.hq + h) * a.n * Cfg::kD;
  const float* o_head = a.dout + (b * a.hq + h) * a.n * Cfg::kD;
  const float* k_head = a.k + (b * a.hkv + hk) * a.m * Cfg::kD;
  const float* v_head = a.v + (b * a.hkv + hk) * a.m * Cfg::kD;
  const float* mu = a.mu == nullptr ? nullptr : a.mu + (b * a.hkv + hk) * Cfg::kD;

  if (tid == 0) {
    key_lo = INT32_MAX;
    key_hi = 0;
  }
  __syncthreads();
  if (tid < Cfg::kBr) {
    const int64_t n = flat < 0 ? -1 : row_of(a, ri0 + tid);
    const KeyRange range = n < 0 ? KeyRange{0, 0} : visible_keys(a, n);
    sm.row_begin[tid] = range.begin;
    sm.row_end[tid] = range.end;
    sm.mask_row[tid] = n < 0 ? 0 : mask_row_offset(a.mask, b, h, n);
    if (range.end > range.begin) {
      atomicMin(&key_lo, range.begin);
      atomicMax(&key_hi, range.end);
    }
  }
  auto q_row = [&](int r) -> const float* {
    const int64_t n = flat < 0 ? -1 : row_of(a, ri0 + r);
    return n < 0 ? nullptr : q_head + n * Cfg::kD;
  };
  auto o_row = [&](int r) -> const float* {
    const int64_t n = flat < 0 ? -1 : row_of(a, ri0 + r);
    return n < 0 ? nullptr : o_head + n * Cfg::kD;
  };
  load_tile<Cfg, Cfg::kBr>(sm.q, q_row, nullptr);
  load_tile<Cfg, Cfg::kBr>(sm.dout, o_row, nullptr);
  __syncthreads();
  const int64_t first_tile = key_lo < key_hi ? (key_lo / Cfg::kBc) * Cfg::kBc : 0;
  const int64_t last_key = key_lo < key_hi ? key_hi : 0;

  // Pass A: online row max, sum and sum of p dP.
  float run_max[Cfg::kRa], run_sum[Cfg::kRa], run_pdp[Cfg::kRa];
#pragma unroll
  for (int i = 0; i < Cfg::kRa; ++i) {
    run_max[i] = -INFINITY;
    run_sum[i] = 0.f;
    run_pdp[i] = 0.f;
  }
  float sc[Cfg::kRa][Cfg::kCb], dp[Cfg::kRa][Cfg::kCb];
  for (int64_t j0 = first_tile; j0 < last_key; j0 += Cfg::kBc) {
    __syncthreads();
    auto k_row = [&](int r) -> const float* { return j0 + r < a.m ? k_head + (j0 + r) * Cfg::kD : nullptr; };
    auto v_row = [&](int r) -> const float* { return j0 + r < a.m ? v_head + (j0 + r) * Cfg::kD : nullptr; };
    load_tile<Cfg, Cfg::kBc>(sm.k, k_row, mu);
    load_tile<Cfg, Cfg::kBc>(sm.v, v_row, nullptr);
    __syncthreads();
    tile_dot<Cfg>(sm.q, sm.k, sc, ty, tx);
    tile_dot<Cfg>(sm.dout, sm.v, dp, ty, tx);
#pragma unroll
    for (int i = 0; i < Cfg::kRa; ++i) {
      const int r = ty + 16 * i;
      const int64_t begin = sm.row_begin[r], end = sm.row_end[r], mask_row = sm.mask_row[r];
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < Cfg::kCb; ++j) {
        const int64_t key = j0 + tx + 16 * j;
        // A bias of -inf leaves the logit -inf: the pair counts as masked.
        sc[i][j] = (key >= begin && key < end && mask_allows(a.mask, mask_row, key))
                       ? masked_logit(a.scale, sc[i][j], mask_bias(a.mask, mask_row, key))
                       : -INFINITY;
        tile_max = fmaxf(tile_max, sc[i][j]);
      }
#pragma unroll
      for (int off = 8; off > 0; off /= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, off));
      const float new_max = fmaxf(run_max[i], tile_max);
      // No visible key so far: keep every lane on the shuffles below (the two
      // half-warps may differ), add nothing and keep the state.
      const bool none = new_max == -INFINITY;
      const float ref = none ? 0.f : new_max;
      float e_sum = 0.f, e_pdp = 0.f;
#pragma unroll
      for (int j = 0; j < Cfg::kCb; ++j) {
        const float e = sc[i][j] == -INFINITY ? 0.f : expf(sc[i][j] - ref);
        e_sum += e;
        e_pdp = fmaf(e, dp[i][j], e_pdp);
      }
#pragma unroll
      for (int off = 8; off > 0; off /= 2) {
        e_sum += __shfl_xor_sync(0xffffffffu, e_sum, off);
        e_pdp += __shfl_xor_sync(0xffffffffu, e_pdp, off);
      }
      const float rescale = none ? 1.f : expf(run_max[i] - new_max);  // 0 on the first visible tile
      run_sum[i] = fmaf(run_sum[i], rescale, e_sum);
      run_pdp[i] = fmaf(run_pdp[i], rescale, e_pdp);
      run_max[i] = new_max;
    }
  }
  // Row statistics: m = 0, l = 1, delta = 0 for rows with no visible key
  // (never read: such rows have no visible pair).
#pragma unroll
  for (int i = 0; i < Cfg::kRa; ++i) {
    const int r = ty + 16 * i;
    const bool any = run_sum[i] > 0.f;
    const float row_max = any ? run_max[i] : 0.f;
    const float row_sum = any ? run_sum[i] : 1.f;
    const float delta = any ? run_pdp[i] / run_sum[i] : 0.f;
    if (tx == 0) {
      sm.row_max[r] = row_max;
      sm.row_sum[r] = row_sum;
      sm.delta[r] = delta;
      if (ri0 + r < a.num_rows) {
        a.row_max[s * a.num_rows + ri0 + r] = row_max;
        a.row_sum[s * a.num_rows + ri0 + r] = row_sum;
        a.delta[s * a.num_rows + ri0 + r] = delta;
      }
    }
  }
  if (!a.dq_in_rows) return;

  // Pass B (deterministic): dQ = sum over key tiles of dS K, in registers.
  float4 acc[Cfg::kRpt][Cfg::kKv4];
#pragma unroll
  for (int i = 0; i < Cfg::kRpt; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kKv4; ++j) acc[i][j] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int64_t j0 = first_tile; j0 < last_key; j0 += Cfg::kBc) {
    __syncthreads();
    auto k_row = [&](int r) -> const float* { return j0 + r < a.m ? k_head + (j0 + r) * Cfg::kD : nullptr; };
    auto v_row = [&](int r) -> const float* { return j0 + r < a.m ? v_head + (j0 + r) * Cfg::kD : nullptr; };
    load_tile<Cfg, Cfg::kBc>(sm.k, k_row, mu);
    load_tile<Cfg, Cfg::kBc>(sm.v, v_row, nullptr);
    __syncthreads();
    tile_dot<Cfg>(sm.q, sm.k, sc, ty, tx);
    tile_dot<Cfg>(sm.dout, sm.v, dp, ty, tx);
    softmax_grad_tile<Cfg>(sm, sc, dp, j0, a.scale, a.mask, ty, tx, false);
    __syncthreads();
    accumulate_dq<Cfg>(sm.ds, sm.k, acc, tc, tk);
  }
#pragma unroll
  for (int i = 0; i < Cfg::kRpt; ++i) {
    const int64_t ri = ri0 + tc * Cfg::kRpt + i;
    if (ri >= a.num_rows) continue;
    float* dst = a.dq + (s * a.num_rows + ri) * Cfg::kD;
#pragma unroll
    for (int j = 0; j < Cfg::kKv4; ++j) *reinterpret_cast<float4*>(dst + 4 * tk + 4 * Cfg::kTk * j) = acc[i][j];
  }
}

template <class Cfg>
__global__ void __launch_bounds__(kThreads, 1) fp32_backward_dkdv_kernel(const Args a) {
  GAUGEWATCH_DYNAMIC_SMEM(smem_raw);
  const Smem<Cfg> sm(reinterpret_cast<float*>(smem_raw));
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int tc = tid / Cfg::kTk, tk = tid % Cfg::kTk;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * Cfg::kBc;
  const int64_t j1 = j0 + Cfg::kBc < a.m ? j0 + Cfg::kBc : a.m;
  const int64_t b = blockIdx.y / a.hkv, hk = blockIdx.y % a.hkv;
  const int64_t group = a.hq / a.hkv;
  const float* k_head = a.k + (b * a.hkv + hk) * a.m * Cfg::kD;
  const float* v_head = a.v + (b * a.hkv + hk) * a.m * Cfg::kD;
  const float* mu = a.mu == nullptr ? nullptr : a.mu + (b * a.hkv + hk) * Cfg::kD;

  auto k_row = [&](int r) -> const float* { return j0 + r < a.m ? k_head + (j0 + r) * Cfg::kD : nullptr; };
  auto v_row = [&](int r) -> const float* { return j0 + r < a.m ? v_head + (j0 + r) * Cfg::kD : nullptr; };
  load_tile<Cfg, Cfg::kBc>(sm.k, k_row, mu);
  load_tile<Cfg, Cfg::kBc>(sm.v, v_row, nullptr);

  float4 dk_acc[Cfg::kCpt][Cfg::kKv4], dv_acc[Cfg::kCpt][Cfg::kKv4];
#pragma unroll
  for (int i = 0; i < Cfg::kCpt; ++i)
#pragma unroll
    for (int j = 0; j < Cfg::kKv4; ++j) {
      dk_acc[i][j] = make_float4(0.f, 0.f, 0.f, 0.f);
      dv_acc[i][j] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  float sc[Cfg::kRa][Cfg::kCb], dp[Cfg::kRa][Cfg::kCb];

  // The group's query heads: in the full mode slices b * Hq + hk * G + [0, G).
  const bool full = a.slices == nullptr;
  const int64_t s_begin = full ? b * a.hq + hk * group : 0;
  const int64_t s_end = full ? s_begin + group : a.num_slices;
  for (int64_t s = s_begin; s < s_end; ++s) {
    const int64_t flat = slice_flat(a, s);
    if (flat < 0 || flat / a.hq != b || (flat % a.hq) / group != hk) continue;
    const float* q_head = a.q + flat * a.n * Cfg::kD;
    const float* o_head = a.dout + flat * a.n * Cfg::kD;
    for (int64_t ri0 = 0; ri0 < a.num_rows; ri0 += Cfg::kBr) {
      __syncthreads();  // previous tile's shared memory is free
      bool sees = false;
      if (tid < Cfg::kBr) {
        const int64_t n = row_of(a, ri0 + tid);
        const KeyRange range = n < 0 ? KeyRange{0, 0} : visible_keys(a, n);
        sm.row_begin[tid] = range.begin;
        sm.row_end[tid] = range.end;
        sm.mask_row[tid] = n < 0 ? 0 : mask_row_offset(a.mask, b, flat % a.hq, n);
        sees = range.begin < j1 && range.end > j0 && range.end > range.begin;
        const int64_t ri = ri0 + tid;
        sm.row_max[tid] = n < 0 ? 0.f : a.row_max[s * a.num_rows + ri];
        sm.row_sum[tid] = n < 0 ? 1.f : a.row_sum[s * a.num_rows + ri];
        sm.delta[tid] = n < 0 ? 0.f : a.delta[s * a.num_rows + ri];
      }
      if (!__syncthreads_or(sees)) continue;
      auto q_row = [&](int r) -> const float* {
        const int64_t n = row_of(a, ri0 + r);
        return n < 0 ? nullptr : q_head + n * Cfg::kD;
      };
      auto o_row = [&](int r) -> const float* {
        const int64_t n = row_of(a, ri0 + r);
        return n < 0 ? nullptr : o_head + n * Cfg::kD;
      };
      load_tile<Cfg, Cfg::kBr>(sm.q, q_row, nullptr);
      load_tile<Cfg, Cfg::kBr>(sm.dout, o_row, nullptr);
      __syncthreads();
      tile_dot<Cfg>(sm.q, sm.k, sc, ty, tx);
      tile_dot<Cfg>(sm.dout, sm.v, dp, ty, tx);
      softmax_grad_tile<Cfg>(sm, sc, dp, j0, a.scale, a.mask, ty, tx, true);
      __syncthreads();
      accumulate_transposed<Cfg, Cfg::kCpt>(sm.p, sm.dout, dv_acc, tc, tk);
      accumulate_transposed<Cfg, Cfg::kCpt>(sm.ds, sm.q, dk_acc, tc, tk);
      if (a.dq_atomic) {
        float4 dq_part[Cfg::kRpt][Cfg::kKv4];
#pragma unroll
        for (int i = 0; i < Cfg::kRpt; ++i)
#pragma unroll
          for (int j = 0; j < Cfg::kKv4; ++j) dq_part[i][j] = make_float4(0.f, 0.f, 0.f, 0.f);
        accumulate_dq<Cfg>(sm.ds, sm.k, dq_part, tc, tk);
#pragma unroll
        for (int i = 0; i < Cfg::kRpt; ++i) {
          const int r = tc * Cfg::kRpt + i;
          const int64_t ri = ri0 + r;
          if (ri >= a.num_rows || sm.row_begin[r] >= j1 || sm.row_end[r] <= j0) continue;
          float* dst = a.dq + (s * a.num_rows + ri) * Cfg::kD;
#pragma unroll
          for (int j = 0; j < Cfg::kKv4; ++j)
            atomicAdd(reinterpret_cast<float4*>(dst + 4 * tk + 4 * Cfg::kTk * j), dq_part[i][j]);
        }
      }
    }
  }
  // Every key row of the tile is written, zeros where no chosen row sees it.
  float* dk_head = a.dk + (b * a.hkv + hk) * a.m * Cfg::kD;
  float* dv_head = a.dv + (b * a.hkv + hk) * a.m * Cfg::kD;
#pragma unroll
  for (int i = 0; i < Cfg::kCpt; ++i) {
    const int64_t key = j0 + tc * Cfg::kCpt + i;
    if (key >= a.m) continue;
#pragma unroll
    for (int j = 0; j < Cfg::kKv4; ++j) {
      const int64_t col = 4 * tk + 4 * Cfg::kTk * j;
      *reinterpret_cast<float4*>(dk_head + key * Cfg::kD + col) = dk_acc[i][j];
      *reinterpret_cast<float4*>(dv_head + key * Cfg::kD + col) = dv_acc[i][j];
    }
  }
}

// Mean key of each (batch, key/value head), FP64 sums in a fixed order.
// grid (B * Hkv), block kThreads; thread t sums column t % D of rows
// t / D, t / D + kThreads / D, ...
template <int D>
__global__ void __launch_bounds__(kThreads) mean_key_kernel(const float* k, float* mu, int64_t m) {
  static_assert(kThreads % D == 0, "mean key layout");
  constexpr int kPhases = kThreads / D;
  __shared__ double partial[kThreads];
  const int tid = threadIdx.x, col = tid % D, phase = tid / D;
  const float* head = k + static_cast<int64_t>(blockIdx.x) * m * D;
  double sum = 0.0;
  for (int64_t row = phase; row < m; row += kPhases) sum += head[row * D + col];
  partial[tid] = sum;
  __syncthreads();
  if (tid < D) {
    double total = 0.0;
    for (int p = 0; p < kPhases; ++p) total += partial[p * D + tid];
    mu[static_cast<int64_t>(blockIdx.x) * D + tid] = m > 0 ? static_cast<float>(total / static_cast<double>(m)) : 0.f;
  }
}

}  // namespace gaugewatch::gpu::detail
