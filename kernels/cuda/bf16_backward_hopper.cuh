#pragma once
// Hopper kernel pair of the fused BF16 backward (the default on sm_90a; math,
// layouts and the choice of structure: kernels/cuda/bf16_backward.h). Same
// two kernels, same arithmetic as the mma.sync pair of
// baseline/bf16_mma_sync_kernel.cuh, but every product is a warpgroup MMA
// (kernels/cuda/wgmma.cuh): operands are read by the tensor cores straight
// from shared memory (no ldmatrix through the register file, the mma.sync
// pair's limit), and t, r feed dQ from registers.
//
// Both kernels run two warpgroups (256 threads); warpgroup wg owns 64 rows of
// every accumulator, warp v of it rows 16 v.., lane 4 g + c rows g and g + 8.
//   dq kernel:   block = 128 query rows (wg: rows 64 wg..), loop over key
//                tiles of 64 (cp.async double buffering):
//                  S = Q K^T, dP = dO V^T       ss, m64n64, D / 16 steps
//                  t, r in registers (bf16_backward.h), row statistics
//                  dQ += t K (and U += r K)     rs, m64nD, B = K MN-major
//   dkdv kernel: block = 128 keys (wg: keys 64 wg..), loop over query tiles
//                of 64 rows of every query head of the group (double buffered):
//                  S = Q K_wg^T, dP = dO V_wg^T ss, m64n64 (the same
//                                               instruction sequence as the
//                                               dq kernel: t, r bit-identical)
//                  t, r -> shared [64 rows][64 keys] per warpgroup
//                  dV += r^T dO, dK += t^T Q    ss, m64nD, A and B MN-major
//                  gproj: dK += r^T bf16(-lambda Q) (rows staged like Q; the
//                  dq kernel wrote them); pivot: fix-up in registers
// Build: instantiated in bf16_backward_d{64,128}_{none,gproj,pivot}.cu.

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/bf16_backward_common.cuh"
#include "kernels/cuda/grid_order.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace gaugewatch::gpu::bf16::hopper {

inline constexpr int kThreads = 2 * wgmma::kWarpgroupThreads;
inline constexpr int kDqRows = kQueryTileRows;  // query rows per dq block
inline constexpr int kDqKeys = 64;   // keys per dq iteration
inline constexpr int kKvKeys = kKeyBlockKeys;  // keys per dkdv block
inline constexpr int kKvRows = 64;   // query rows per dkdv iteration
static_assert(kKvRows == 64, "pivot's hit mask is two 32-row ballot words");

// Named barriers: 0 is __syncthreads, 1 and 2 the dkdv kernel's per-warpgroup
// barriers (1 + wg), 3 the pingpong that lets warpgroup 1 issue its S and dP
// MMAs after warpgroup 0's (wgmma::pingpong_arrive), so that one warpgroup's
// element work overlaps the other's MMAs in every iteration.
inline constexpr int kPingpongBarrier = 3;

// One block (two warpgroups) per SM. At D = 128 a warpgroup holds two
// m64n128 accumulators (128 registers) besides S and dP; at D = 64 two blocks
// would need 128 registers, and ptxas then spills 300-430 bytes and
// serializes the wgmmas (nvcc 13.0).
inline constexpr int kBlocksPerSm = 1;

// Copies rows [row0, row0 + R) of a (rows, D) BF16 matrix into an R-row tile
// (wgmma::tile_offset layout); rows past `rows` are zero-filled.
template <int R, int D>
__device__ __forceinline__ void load_rows(uint16_t* dst, const uint16_t* src, int64_t row_stride, int row0, int rows) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < R * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = row0 + r < rows;
    const uint16_t* from = src + (valid ? static_cast<int64_t>(row0 + r) * row_stride + c * 8 : 0);
    mma::cp_async_16(dst + wgmma::chunk_offset<R>(r, c), from, valid);
  }
}

// Waits for this thread's copies of the current buffer (the next buffer's stay
// in flight when `next_in_flight`), then publishes every thread's copies to
// the block and to the tensor cores (cp.async writes through the generic
// proxy, wgmma reads through the async one).
__device__ __forceinline__ void publish_buffer(bool next_in_flight) {
  if (next_in_flight) {
    mma::cp_async_wait<1>();
  } else {
    mma::cp_async_wait<0>();
  }
  wgmma::fence_proxy_async();
  __syncthreads();
}

template <int F>
__device__ __forceinline__ void zero(float (&acc)[F]) {
#pragma unroll
  for (int i = 0; i < F; ++i) acc[i] = 0.0f;
}

// S (64 x 64) = X Y^T over the head dim: X rows x_row0.. of an XR-row tile,
// Y rows y_row0.. of a YR-row tile, both K-major. Issued, not waited for.
template <int D, int XR, int YR>
__device__ __forceinline__ void scores_mma(float (&s)[32], const uint16_t* x, int x_row0, const uint16_t* y,
                                           int y_row0) {
  wgmma::mma_ss_first<false, false>(s, wgmma::desc_k_major(x, wgmma::chunk_offset<XR>(x_row0, 0)),
                                    wgmma::desc_k_major(y, wgmma::chunk_offset<YR>(y_row0, 0)));
#pragma unroll
  for (int kk = 1; kk < D / 16; ++kk) {
    wgmma::mma_ss<false, false>(s, wgmma::desc_k_major(x, wgmma::chunk_offset<XR>(x_row0, 2 * kk)),
                                wgmma::desc_k_major(y, wgmma::chunk_offset<YR>(y_row0, 2 * kk)));
  }
}

// P_ij = exp2(s_ij alpha log2e - lse_i log2e), the expression of scores_to_tr
// below, for kernels that need r only (the key-outer gproj's second pass,
// which must reproduce its first pass's r bit for bit: the same FFMA and
// ex2.approx of the same operands). scores_to_tr keeps its own copy inline:
// through this call ptxas predicates the tuned kernels' select differently.
__device__ __forceinline__ float probability(const Args& a, float s, float lse_log2, bool visible) {
  return visible ? mma::exp2_approx(fmaf(s, a.scale_log2, -lse_log2)) : 0.0f;
}

// The key of accumulator element i (0..31) of lane quad position c in an
// m64n64 tile whose first key is j_base (wgmma.cuh's fragment layout; the
// same for elements 0..15 of an m64n32 tile).
__device__ __forceinline__ int element_key(int j_base, int c, int i) {
  return j_base + 8 * (i >> 2) + 2 * c + (i & 1);
}

// Calls element(i, test) for the E accumulator elements i of this thread's
// two rows (key ranges [kb, ke) each) in an m64n(2 E) tile whose first key is
// j_base (E = 32: m64n64; 16: m64n32, the head-dim-256 kernel's S): test is
// std::false_type where every row of the warp sees all 2 E keys (a warp
// vote: every tile off the mask's edge), so the caller can drop its
// per-element visibility test there, and std::true_type otherwise.
template <int E = 32, class Element>
__device__ __forceinline__ void for_each_tile_element(const int (&kb)[2], const int (&ke)[2], int j_base,
                                                      Element&& element) {
  const bool sees_all =
      kb[0] <= j_base && ke[0] >= j_base + 2 * E && kb[1] <= j_base && ke[1] >= j_base + 2 * E;
  if (__ballot_sync(0xffffffffu, sees_all) == 0xffffffffu) {
#pragma unroll
    for (int i = 0; i < E; ++i) element(i, std::false_type{});
  } else {
#pragma unroll
    for (int i = 0; i < E; ++i) element(i, std::true_type{});
  }
}

// Turns S into r = bf16(P) and dP into t = bf16(P (dP - delta)) in place, for
// this thread's rows (half 0: g, half 1: g + 8) and keys j_base + 8 jn + 2 c
// + (e & 1). `visit(half, j, visible, p, t, r, s, i)` sees every element i
// (its key j = element_key(j_base, c, i), a constant i after unrolling), keys
// in increasing order per row. kRound = false leaves t and r (in place and
// as visited) unrounded, for callers that only pack them to BF16: pack_bf16
// rounds to nearest even as round_bf16 does, and RN(RN(x)) = RN(x), so the
// MMAs consume the same bits for two conversions fewer per element.
// A warp whose rows all see all 64 keys (every tile off the mask's edge)
// takes a loop without the per-element visibility test: the same
// instructions on the visible elements, so the same bits, for about half the
// integer and select work per element.
// E: the fragment's elements per thread (32: m64n64, 16: m64n32).
template <bool kRound = true, int E, class Visit>
__device__ __forceinline__ void scores_to_tr(const Args& a, float (&s)[E], float (&dp)[E], const RowInputs& in,
                                             int j_base, Visit&& visit) {
  const int c = threadIdx.x & 3;
  const float scale_log2 = a.scale_log2;
  // kTest = false: every element is visible (for_each_tile_element's vote).
  auto element = [&](int i, auto test) {
    const int half = (i >> 1) & 1;
    const int j = element_key(j_base, c, i);
    const bool visible = !decltype(test)::value || (j >= in.kb[half] && j < in.ke[half]);
    // exp2(s alpha log2e - lse log2e) as FlashAttention forms it; a select,
    // not a multiply, for masked keys, so NaN or Inf in padding never leaks.
    const float p = visible ? mma::exp2_approx(fmaf(s[i], scale_log2, -in.lse_log2[half])) : 0.0f;
    const float t_exact = visible ? p * (dp[i] - in.delta[half]) : 0.0f;
    const float t = kRound ? mma::round_bf16(t_exact) : t_exact;
    const float r = kRound ? mma::round_bf16(p) : p;
    visit(half, j, visible, p, t, r, s[i], i);
    s[i] = r;
    dp[i] = t;
  };
  for_each_tile_element<E>(in.kb, in.ke, j_base, element);
}

// The dq kernel's grid: 1-D, one block per (batch, query head, query tile),
// in a.q_sections sections of heads, query tile first within a section and
// counted from the last under causal masking (grid_order.cuh): the heaviest
// tiles (the last query tiles see the most keys) start first, and the
// blocks running at once share few heads' K and V in L2.
inline int64_t query_tile_count(const Args& a) {
  return static_cast<int64_t>(a.batch) * a.hq * ((static_cast<int64_t>(a.n) + kDqRows - 1) / kDqRows);
}
inline dim3 query_tile_grid(const Args& a) { return dim3(static_cast<unsigned>(query_tile_count(a))); }
struct QueryTile {
  int tile, bh;
};
__device__ __forceinline__ QueryTile query_tile(const Args& a) {
  const int tiles = (a.n + kDqRows - 1) / kDqRows;
  const auto [t, bh] = grid_order::sectioned(static_cast<int>(blockIdx.x), a.batch * a.hq, tiles, a.q_sections);
  return {a.causal != 0 ? tiles - 1 - t : t, bh};
}

// Shared memory of the dq kernel (BF16 elements, offsets 1024-byte aligned).
template <int D>
struct DqLayout {
  static constexpr int kQ = 0, kGo = kDqRows * D;
  static constexpr int kK0 = 2 * kDqRows * D, kV0 = kK0 + kDqKeys * D;
  static constexpr int kK1 = kV0 + kDqKeys * D, kV1 = kK1 + kDqKeys * D;
  static constexpr size_t kBytes = static_cast<size_t>(kV1 + kDqKeys * D) * 2 + 1024;  // + alignment slack
};

template <int D, Projection P>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) dq_kernel(const Args a) {
  GAUGEWATCH_BF16_SMEM(raw);
  uint16_t* smem = wgmma::align_1024(raw);
  using L = DqLayout<D>;
  constexpr uint32_t kSubTile = kDqKeys * 64 * 2;  // bytes between the K tile's 64-column blocks
  const auto [tile, bh] = query_tile(a);
  const int b = bh / a.hq, h = bh % a.hq, hk = h / a.group;
  const int i0 = tile * kDqRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wg = warp >> 2, g = lane >> 2, c = lane & 3;
  const int row0 = 64 * wg + 16 * (warp & 3);  // this warp's first row in the block

  const QueryHead qh = query_head(a, b, h);
  const KeyHead kh = key_head(a, b, hk);
  const int64_t row_base = static_cast<int64_t>(bh) * a.n;  // qh.row_base

  const RowInputs in = row_inputs(a, i0 + row0, qh.lse, row_base);
  // Key tiles: from the first row's first visible key to the last row's end
  // (visible ranges are monotone along the rows).
  const int last_row = (i0 + kDqRows < a.n ? i0 + kDqRows : a.n) - 1;
  const int j_begin = row_keys(a, i0).begin / kDqKeys * kDqKeys;
  const int j_end = row_keys(a, last_row).end;

  load_rows<kDqRows, D>(smem + L::kQ, qh.q, a.q_strides.row, i0, a.n);
  load_rows<kDqRows, D>(smem + L::kGo, qh.grad_out, a.grad_out_strides.row, i0, a.n);
  if (j_begin < j_end) {
    load_rows<kDqKeys, D>(smem + L::kK0, kh.k, a.k_strides.row, j_begin, a.m);
    load_rows<kDqKeys, D>(smem + L::kV0, kh.v, a.v_strides.row, j_begin, a.m);
  }
  mma::cp_async_commit();

  float dq[D / 2], u[D / 2];
  zero(dq);
  if constexpr (P == Projection::kGproj) zero(u);
  // Row statistics of rows g and g + 8 over this thread's keys.
  RowStats row_stats;
  // Row diagnostics are written by the bf16 variant only (validate() refuses
  // them elsewhere): the other variants keep those registers free.
  const bool want_diag = P == Projection::kNone && a.diag.any();

  int buf = 0;
  for (int j0 = j_begin; j0 < j_end; j0 += kDqKeys) {
    const bool more = j0 + kDqKeys < j_end;
    if (more) {
      load_rows<kDqKeys, D>(smem + (buf ? L::kK0 : L::kK1), kh.k, a.k_strides.row, j0 + kDqKeys, a.m);
      load_rows<kDqKeys, D>(smem + (buf ? L::kV0 : L::kV1), kh.v, a.v_strides.row, j0 + kDqKeys, a.m);
      mma::cp_async_commit();
    }
    publish_buffer(more);
    const uint16_t* ks = smem + (buf ? L::kK1 : L::kK0);
    const uint16_t* vs = smem + (buf ? L::kV1 : L::kV0);

    float s[32], dp[32];  // written by scores_mma (its first step does not read them)
    if (wg == 1) wgmma::pingpong_wait(kPingpongBarrier);
    wgmma::fence();
    scores_mma<D, kDqRows, kDqKeys>(s, smem + L::kQ, 64 * wg, ks, 0);
    scores_mma<D, kDqRows, kDqKeys>(dp, smem + L::kGo, 64 * wg, vs, 0);
    wgmma::commit();
    if (wg == 0) wgmma::pingpong_arrive(kPingpongBarrier);
    wgmma::wait<0>();
    wgmma::fence_operand(s);
    wgmma::fence_operand(dp);

    // Two instantiations of the element loop: the diagnostics' extra
    // statistics cost the bf16 variant ~15% of its dq kernel when compiled in
    // unused (H200), so the common call runs the lean one.
    if (want_diag) {
      scores_to_tr(a, s, dp, in, j0, [&](int hh, int j, bool visible, float p, float t, float r, float sv, int) {
        row_stats.add<true, true>(hh, j, visible, p, t, r, a.scale * sv);
      });
    } else {
      scores_to_tr(a, s, dp, in, j0, [&](int hh, int j, bool visible, float p, float t, float r, float, int) {
        row_stats.add<false, P == Projection::kPivot>(hh, j, visible, p, t, r, 0.0f);
      });
    }
    uint32_t tf[4][4];
    wgmma::accumulator_to_a(tf, dp);
    wgmma::fence();
    if constexpr (P == Projection::kGproj) {
      uint32_t rf[4][4];
      wgmma::accumulator_to_a(rf, s);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint64_t kd = wgmma::desc_mn_major(ks, wgmma::chunk_offset<kDqKeys>(16 * k, 0), kSubTile);
        wgmma::mma_rs<true>(dq, tf[k], kd);
        wgmma::mma_rs<true>(u, rf[k], kd);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        wgmma::mma_rs<true>(dq, tf[k], wgmma::desc_mn_major(ks, wgmma::chunk_offset<kDqKeys>(16 * k, 0), kSubTile));
      }
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operand(dq);
    if constexpr (P == Projection::kGproj) wgmma::fence_operand(u);
    // Every warpgroup is done with this K/V buffer before the next iteration refills it.
    __syncthreads();
    buf ^= 1;
  }
  mma::cp_async_wait<0>();
  // gproj's epilogue reads Q rows that other threads copied. The key loop's
  // barriers published them, but a block whose rows see no key runs no
  // iteration (bottom-right causal with N - M >= 128, empty packed segments),
  // and the dkdv kernel can still stage those rows' bf16(-lambda q).
  if constexpr (P == Projection::kGproj) __syncthreads();

  row_stats.reduce_quad();
  const float* rho = row_stats.rho;
  const float* mass = row_stats.mass;
  const int* parg = row_stats.parg;

  // dQ' = alpha (dQacc - correction), rounded once to BF16.
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int row = i0 + row0 + g + 8 * hh;
    if (row >= a.n) continue;
    const int64_t orow = row_base + row;
    const float lam = mass[hh] > 0.0f ? rho[hh] / mass[hh] : 0.0f;
    uint16_t* out = output_row(a.dq, a.dq_strides, b, h, row);
    const uint16_t* kstar = (P == Projection::kPivot && parg[hh] >= 0) ? kh.k + parg[hh] * a.k_strides.row : nullptr;
#pragma unroll
    for (int jn = 0; jn < D / 8; ++jn) {
      const int col = 8 * jn + 2 * c;
      float x0 = dq[4 * jn + 2 * hh], x1 = dq[4 * jn + 2 * hh + 1];
      if constexpr (P == Projection::kGproj) {
        x0 -= lam * u[4 * jn + 2 * hh];
        x1 -= lam * u[4 * jn + 2 * hh + 1];
      } else if constexpr (P == Projection::kPivot) {
        if (kstar != nullptr) {
          x0 -= rho[hh] * mma::bf16_bits_to_float(kstar[col]);
          x1 -= rho[hh] * mma::bf16_bits_to_float(kstar[col + 1]);
        }
      }
      *reinterpret_cast<uint32_t*>(out + col) = mma::pack_bf16(a.scale * x0, a.scale * x1);
    }
    if constexpr (P == Projection::kGproj) {
      // bf16(-lambda_i q_i), the B operand of the dkdv kernel's third product
      // (the sign folded in: negation is exact in BF16), once per row here
      // rather than once per key tile there. Q is still in shared memory.
      uint16_t* lq = a.neg_lambda_q + orow * D;
#pragma unroll
      for (int jn = 0; jn < D / 8; ++jn) {
        const int col = 8 * jn + 2 * c;
        const uint32_t qq =
            *reinterpret_cast<const uint32_t*>(smem + L::kQ + wgmma::tile_offset<kDqRows>(row0 + g + 8 * hh, col));
        const float q0 = mma::bf16_bits_to_float(static_cast<uint16_t>(qq & 0xffffu));
        const float q1 = mma::bf16_bits_to_float(static_cast<uint16_t>(qq >> 16));
        *reinterpret_cast<uint32_t*>(lq + col) = mma::pack_bf16(-lam * q0, -lam * q1);
      }
    }
    // One thread per row writes the per-row outputs.
    if (c == 0) {
      if constexpr (P == Projection::kGproj) a.row_factor[orow] = lam;
      if constexpr (P == Projection::kPivot) {
        a.row_factor[orow] = rho[hh];
        a.pivot_key[orow] = parg[hh];
      }
      if (want_diag) {
        if (a.diag.row_mass) a.diag.row_mass[orow] = rho[hh];
        if (a.diag.prob_mass) a.diag.prob_mass[orow] = mass[hh];
        if (a.diag.abs_row_mass) a.diag.abs_row_mass[orow] = row_stats.abs_rho[hh];
        if (a.diag.p_max) a.diag.p_max[orow] = fmaxf(row_stats.pmax[hh], 0.0f);
        if (a.diag.logit_abs_max) a.diag.logit_abs_max[orow] = row_stats.lmax[hh];
        if (a.diag.pivot) a.diag.pivot[orow] = parg[hh];
      }
    }
  }
}

// Shared memory of the dkdv kernel (BF16 elements, offsets 1024-byte
// aligned): K, V (128 keys), two Q/dO (and for gproj bf16(-lambda Q), which
// the dq kernel wrote) buffers of 64 rows,
// t and r of each warpgroup ([64 rows][64 keys] each), then the per-row
// arrays of the two buffers (StagedRows).
// Per-row inputs of one query tile in the dkdv kernel, staged in shared
// memory (rows past N zero-filled).
struct StagedRows {
  float* lse;    // natural-log lse as saved
  float* delta;
  float* row_factor;  // lambda (gproj) or rho (pivot)
  int* pivot_key;     // j* (pivot)
  int* kb;
  int* ke;
};
inline constexpr int kStagedArrays = 6;

__device__ __forceinline__ StagedRows staged_rows(float* base, int buf) {
  float* p = base + buf * kStagedArrays * kKvRows;
  return {p, p + kKvRows, p + 2 * kKvRows, reinterpret_cast<int*>(p + 3 * kKvRows),
          reinterpret_cast<int*>(p + 4 * kKvRows), reinterpret_cast<int*>(p + 5 * kKvRows)};
}

// RowInputs of staged rows `row` and `row + 8` (a thread's two rows: row0 + g
// of its warp). The lse of a row that sees no key is never read (P is a
// select on visibility), whatever it holds.
__device__ __forceinline__ RowInputs staged_row_inputs(const StagedRows& ra, int row) {
  RowInputs in;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int r = row + 8 * hh;
    in.kb[hh] = ra.kb[r];
    in.ke[hh] = ra.ke[r];
    in.lse_log2[hh] = ra.lse[r] * kLog2e;
    in.delta[hh] = ra.delta[r];
  }
  return in;
}

// The cp.async loads of the query tile of head h at rows i0.. into q_dst and
// g_dst (Q and dO, [64][D] each) and of its rows' inputs (lse, delta; the
// visible key range by plain stores) into buffer `buf` of the staged rows at
// rows_base (rows past N: zeros and an empty key range). Every thread of the
// block takes part, threads 0 .. 63 stage the rows; the caller commits.
// keyouter_kernel's and the head-dim-256 key-outer kernel's loads.
template <int D>
__device__ __forceinline__ void load_query_tile(const Args& a, int b, int h, int i0, uint16_t* q_dst, uint16_t* g_dst,
                                                float* rows_base, int buf) {
  const QueryHead qh = query_head(a, b, h);
  load_rows<kKvRows, D>(q_dst, qh.q, a.q_strides.row, i0, a.n);
  load_rows<kKvRows, D>(g_dst, qh.grad_out, a.grad_out_strides.row, i0, a.n);
  if (threadIdx.x < kKvRows) {
    const StagedRows sr = staged_rows(rows_base, buf);
    const int r = threadIdx.x, row = i0 + r;
    const bool ok = row < a.n;
    const KeyRange kr = row_keys(a, row);
    sr.kb[r] = kr.begin;
    sr.ke[r] = kr.end;
    mma::cp_async_4(sr.lse + r, qh.lse + (ok ? row : 0), ok);
    mma::cp_async_4(sr.delta + r, a.delta + qh.row_base + (ok ? row : 0), ok);
  }
}

// The grid of the dkdv kernel and the key-outer kernels (keyouter_kernel,
// keyouter_ws_kernel, gproj_keys_kernel, gproj_keys_ws_kernel): 1-D, one
// block per (batch, kv head, block of kKvKeys keys), in a.kv_sections
// sections of kv heads, key block first within a section
// (grid_order.cuh): under causal masking (top-left or bottom-right) the
// first key blocks see the most query tiles and start first, and the
// blocks running at once share few heads' query rows and dQ accumulator
// in L2.
// Blocks of kKeys keys other than kKvKeys (gproj's second pass over 256
// keys, bf16_gproj_keys_ws_kernel.cuh) take their own sections
// (Args::wide_kv_sections).
template <int kKeys = kKvKeys>
inline int64_t key_block_count(const Args& a) {
  return static_cast<int64_t>(a.batch) * a.hkv * ((static_cast<int64_t>(a.m) + kKeys - 1) / kKeys);
}
template <int kKeys = kKvKeys>
inline dim3 key_block_grid(const Args& a) {
  return dim3(static_cast<unsigned>(key_block_count<kKeys>(a)));
}
struct KeyBlock {
  int j0, b, hk;
};
// The block's (first key, batch, kv head); `block` is blockIdx.x (an
// opaque read of it, block_x_again, recomputes them after a main loop
// instead of holding them in registers across it).
template <int kKeys = kKvKeys>
__device__ __forceinline__ KeyBlock key_block(const Args& a, int block = static_cast<int>(blockIdx.x)) {
  const int blocks = (a.m + kKeys - 1) / kKeys;
  if constexpr (kKeys == kKvKeys) {
    const auto [kb, bhk] = grid_order::sectioned(block, a.batch * a.hkv, blocks, a.kv_sections);
    return {kb * kKeys, bhk / a.hkv, bhk % a.hkv};
  } else {
    const auto [kb, bhk] = grid_order::sectioned(block, a.batch * a.hkv, blocks, a.wide_kv_sections);
    return {kb * kKeys, bhk / a.hkv, bhk % a.hkv};
  }
}

template <int D, Projection P>
struct KvLayout {
  static constexpr int kRowTile = kKvRows * D;
  static constexpr int kK = 0, kV = kKvKeys * D;
  static constexpr int kQ0 = 2 * kKvKeys * D, kG0 = kQ0 + kRowTile, kQ1 = kG0 + kRowTile, kG1 = kQ1 + kRowTile;
  static constexpr int kL0 = kG1 + kRowTile, kL1 = kL0 + (P == Projection::kGproj ? kRowTile : 0);
  static constexpr int kTr = kL1 + (P == Projection::kGproj ? kRowTile : 0);  // t0, r0, t1, r1
  static constexpr int kScoreTile = kKvRows * 64;
  static constexpr int kRows = kTr + 4 * kScoreTile;
  static constexpr int kRowFloats = 2 * kStagedArrays * kKvRows;
  static constexpr size_t kBytes = static_cast<size_t>(kRows) * 2 + kRowFloats * 4 + 1024;  // + alignment slack
};

template <int D, Projection P>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm) dkdv_kernel(const Args a) {
  GAUGEWATCH_BF16_SMEM(raw);
  uint16_t* smem = wgmma::align_1024(raw);
  using L = KvLayout<D, P>;
  constexpr uint32_t kSubTile = kKvRows * 64 * 2;  // bytes between a row tile's 64-column blocks
  const auto [j0, b, hk] = key_block(a);  // the heaviest key blocks first
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wg = warp >> 2, v = warp & 3, g = lane >> 2, c = lane & 3;
  const int row0 = 16 * v;  // this warp's first query row of a tile (scores) / first key of its warpgroup's 64

  const KeyHead kh = key_head(a, b, hk);
  float* rows_base = reinterpret_cast<float*>(smem + L::kRows);
  uint16_t* t_tile = smem + L::kTr + wg * 2 * L::kScoreTile;
  uint16_t* r_tile = t_tile + L::kScoreTile;

  const RowTiles seen = tiles_seeing_keys(a, j0, kKvKeys, kKvRows);
  const int t_begin = seen.first, tiles = seen.count;
  const int iters = tiles * a.group;

  load_rows<kKvKeys, D>(smem + L::kK, kh.k, a.k_strides.row, j0, a.m);
  load_rows<kKvKeys, D>(smem + L::kV, kh.v, a.v_strides.row, j0, a.m);

  // Issues the loads of iteration `it` (query head, query tile) into buffer
  // `buf`: the Q and dO tiles and the per-row inputs, all by cp.async, so no
  // thread waits on global memory while the current tile is computed.
  auto tile_row0 = [&](int it) { return (t_begin + it % tiles) * kKvRows; };
  auto stage = [&](int it, int buf) {
    const int h = hk * a.group + it / tiles;
    const int i0 = tile_row0(it);
    const QueryHead qh = query_head(a, b, h);
    load_rows<kKvRows, D>(smem + (buf ? L::kQ1 : L::kQ0), qh.q, a.q_strides.row, i0, a.n);
    load_rows<kKvRows, D>(smem + (buf ? L::kG1 : L::kG0), qh.grad_out, a.grad_out_strides.row, i0, a.n);
    if constexpr (P == Projection::kGproj) {
      load_rows<kKvRows, D>(smem + (buf ? L::kL1 : L::kL0), a.neg_lambda_q + qh.row_base * D, D, i0, a.n);
    }
    if (threadIdx.x < kKvRows) {
      const StagedRows sr = staged_rows(rows_base, buf);
      const int r = threadIdx.x, row = i0 + r;
      const bool ok = row < a.n;
      const int64_t at = qh.row_base + (ok ? row : 0);
      const KeyRange kr = row_keys(a, row);  // arithmetic (packed: a search of cu_seqlens)
      sr.kb[r] = kr.begin;
      sr.ke[r] = kr.end;
      mma::cp_async_4(sr.lse + r, qh.lse + (ok ? row : 0), ok);
      mma::cp_async_4(sr.delta + r, a.delta + at, ok);
      if constexpr (P != Projection::kNone) mma::cp_async_4(sr.row_factor + r, a.row_factor + at, ok);
      if constexpr (P == Projection::kPivot) mma::cp_async_4(sr.pivot_key + r, a.pivot_key + at, ok);
    }
  };
  if (iters > 0) stage(0, 0);
  mma::cp_async_commit();

  float dk[D / 2], dv[D / 2];
  zero(dk);
  zero(dv);

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    const bool more = it + 1 < iters;
    if (more) {
      stage(it + 1, buf ^ 1);
      mma::cp_async_commit();
    }
    publish_buffer(more);
    const uint16_t* qs = smem + (buf ? L::kQ1 : L::kQ0);
    const uint16_t* gos = smem + (buf ? L::kG1 : L::kG0);
    const uint16_t* lqs = smem + (buf ? L::kL1 : L::kL0);  // gproj: bf16(-lambda Q)
    const StagedRows ra = staged_rows(rows_base, buf);

    const RowInputs in = staged_row_inputs(ra, row0 + g);
    float s[32], dp[32];  // written by scores_mma (its first step does not read them)
    if (wg == 1) wgmma::pingpong_wait(kPingpongBarrier);
    wgmma::fence();
    scores_mma<D, kKvRows, kKvKeys>(s, qs, 0, smem + L::kK, 64 * wg);
    scores_mma<D, kKvRows, kKvKeys>(dp, gos, 0, smem + L::kV, 64 * wg);
    wgmma::commit();
    if (wg == 0) wgmma::pingpong_arrive(kPingpongBarrier);
    wgmma::wait<0>();
    wgmma::fence_operand(s);
    wgmma::fence_operand(dp);
    scores_to_tr(a, s, dp, in, j0 + 64 * wg, [](int, int, bool, float, float, float, float, int) {});
    // t and r to this warpgroup's [64 rows][64 keys] tiles: the A operands
    // (keys x rows, MN-major) of dK and dV.
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int off = wgmma::tile_offset<kKvRows>(row0 + g + 8 * hh, 8 * jn + 2 * c);
        *reinterpret_cast<uint32_t*>(t_tile + off) = mma::pack_bf16(dp[4 * jn + 2 * hh], dp[4 * jn + 2 * hh + 1]);
        *reinterpret_cast<uint32_t*>(r_tile + off) = mma::pack_bf16(s[4 * jn + 2 * hh], s[4 * jn + 2 * hh + 1]);
      }
    }
    wgmma::fence_proxy_async();
    wgmma::warpgroup_barrier(1 + wg);

    wgmma::fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int step = wgmma::chunk_offset<kKvRows>(16 * k, 0);  // rows 16 k.. of every [64][*] tile
      const uint64_t rd = wgmma::desc_mn_major(r_tile, step, kSubTile);
      wgmma::mma_ss<true, true>(dv, rd, wgmma::desc_mn_major(gos, step, kSubTile));
      wgmma::mma_ss<true, true>(dk, wgmma::desc_mn_major(t_tile, step, kSubTile),
                                wgmma::desc_mn_major(qs, step, kSubTile));
      if constexpr (P == Projection::kGproj) {
        wgmma::mma_ss<true, true>(dk, rd, wgmma::desc_mn_major(lqs, step, kSubTile));
      }
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_operand(dk);
    wgmma::fence_operand(dv);

    if constexpr (P == Projection::kPivot) {
      // dKacc_j -= rho_i q_i for the rows i of this query tile whose pivot
      // j = j*(i) is in this key tile, straight into the accumulator: key
      // j - j0 = 64 wg' + 16 v' + 8 hh + g' lives in warp v' of warpgroup
      // wg', lanes 4 g'.. 4 g' + 3, elements 4 jn + 2 hh and 4 jn + 2 hh + 1.
      // Each element is owned by one thread and its rows are visited in
      // increasing i: deterministic (an explicit FMA, so the CPU emulation
      // rounds as the GPU does). Only rows whose pivot is in this key tile
      // are visited (usually none or a few, all 64 in the tile holding an
      // attention sink); padding rows (past N, staged j* a zero fill) never.
      // Each warp visits only the rows whose pivot is one of its 16 keys (a
      // ballot over the tile's 64 rows): with every thread visiting every
      // flagged row, the fix-up cost pivot 13-17% of the whole backward
      // (H200, causal N 4096: 3.80 ms against 3.31 ms without it at d = 128).
      const int i0 = tile_row0(it);
      auto hit = [&](int r) {
        const int js = ra.pivot_key[r] - j0;
        return i0 + r < a.n && js >= 0 && js < kKvKeys && (js >> 4) == 4 * wg + v;
      };
      const uint64_t hits = __ballot_sync(0xffffffffu, hit(lane)) |
                            (static_cast<uint64_t>(__ballot_sync(0xffffffffu, hit(32 + lane))) << 32);
      // Then each lane group g takes its own rows, split by which of its two
      // keys (g or g + 8 of the warp's 16) they hit, so the eight groups work
      // in parallel and no branch diverges inside the updates.
      uint64_t mine_lo = 0, mine_hi = 0;
      for (uint64_t left = hits; left != 0; left &= left - 1) {
        const int r = __ffsll(static_cast<long long>(left)) - 1;
        const int js = ra.pivot_key[r] - j0;
        if ((js & 7) != g) continue;
        if ((js >> 3) & 1) {
          mine_hi |= uint64_t{1} << r;
        } else {
          mine_lo |= uint64_t{1} << r;
        }
      }
      // Constant element indices (a runtime index would move dk to local memory).
      auto fix_up = [&](uint64_t rows, int e) {
        for (; rows != 0; rows &= rows - 1) {
          const int r = __ffsll(static_cast<long long>(rows)) - 1;
          const float neg_rho = -ra.row_factor[r];
#pragma unroll
          for (int jn = 0; jn < D / 8; ++jn) {
            const int col = 8 * jn + 2 * c;
            const uint32_t qq = *reinterpret_cast<const uint32_t*>(qs + wgmma::tile_offset<kKvRows>(r, col));
            const float q0 = mma::bf16_bits_to_float(static_cast<uint16_t>(qq & 0xffffu));
            const float q1 = mma::bf16_bits_to_float(static_cast<uint16_t>(qq >> 16));
            dk[4 * jn + e] = fmaf(neg_rho, q0, dk[4 * jn + e]);
            dk[4 * jn + e + 1] = fmaf(neg_rho, q1, dk[4 * jn + e + 1]);
          }
        }
      };
      fix_up(mine_lo, 0);
      fix_up(mine_hi, 2);
    }
    // Buffers, -lambda Q and the t/r tiles are free for the next iteration.
    __syncthreads();
  }
  mma::cp_async_wait<0>();

  // dK = bf16(alpha dKacc), dV = bf16(dVacc) (pivot's fix-up already in dKacc).
  // Keys past M are not written.
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = j0 + 64 * wg + row0 + g + 8 * hh;
    if (key >= a.m) continue;
    uint16_t* dko = output_row(a.dk, a.dk_strides, b, hk, key);
    uint16_t* dvo = output_row(a.dv, a.dv_strides, b, hk, key);
#pragma unroll
    for (int jn = 0; jn < D / 8; ++jn) {
      const int col = 8 * jn + 2 * c;
      *reinterpret_cast<uint32_t*>(dko + col) =
          mma::pack_bf16(a.scale * dk[4 * jn + 2 * hh], a.scale * dk[4 * jn + 2 * hh + 1]);
      *reinterpret_cast<uint32_t*>(dvo + col) = mma::pack_bf16(dv[4 * jn + 2 * hh], dv[4 * jn + 2 * hh + 1]);
    }
  }
}

}  // namespace gaugewatch::gpu::bf16::hopper
