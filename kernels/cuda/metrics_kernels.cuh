#pragma once
// Kernel bodies of the metric reductions (API and the math: kernels/cuda/metrics.h).
//
//   key_centre_kernel      grid (B * Hkv):  c = bf16(mean key), FP64 sums in a fixed order
//   translate_keys_kernel  grid-stride:     k_out = bf16(k - c)
//   translate_lse_kernel   one thread/row:  lse_out = float(lse - alpha q.c), FP64 dot in the
//                                           reference's lane order (bit-identical lse)
//   geometry_kernel        grid (ceil(N / 16), B * Hq), 16 threads per query row:
//       pass 1 over key tiles: s' = alpha q.k' + bias (FP32, k' = k - c exact; bias:
//         attn_mask's, -inf or a False entry masking the pair out), online max m,
//         l = sum exp(s' - m), U = sum exp(s' - m) k'  ->  mu' = U / l, p_max = 1 / l
//       pass 2 over the same tiles: sum_j p_j ||k'_j - mu'||^2 with p_j in FP64 (no
//         underflow below e^-87), max |s' + alpha q.c|
//       writes offset^2, sigma^2, p_max, logit max per row (FP64; rows with no
//       visible key marked kExcluded)
//   row_finish_kernel      one thread/row: offset, spread = sqrt, ratio (kExcluded when
//                          the spread is 0)
//   row_stats_kernel       grid (kRowBlocks): per block max / sum / count partials
//   norms_kernel           grid (kNormBlocks, jobs): sum (a - b)^2 and sum b^2 partials
//   medians_kernel         grid (3): exact median by radix select (4 bits a pass) on the
//                          FP64 bit patterns, which order like the values for x >= 0
//   finish_kernel          one thread combines the partials in a fixed order
// Everything is plain CUDA the CPU emulation (tests/cuda/emulation) also has:
// __syncthreads, float warp shuffles, static shared arrays, no atomics, no cub.
// Every reduction has a fixed owner and order: results are bit-identical run to run.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/element_bits.cuh"
#include "kernels/cuda/masking.cuh"
#include "kernels/cuda/metrics_args.cuh"

// The block's dynamic shared memory; the CPU emulation supplies its own.
#ifndef GAUGEWATCH_DYNAMIC_SMEM
#define GAUGEWATCH_DYNAMIC_SMEM(name) extern __shared__ float4 name[]
#endif

namespace gaugewatch::gpu::detail {

// Correctly rounded reciprocals without the division slow-path call (whose
// calling convention spills the geometry kernel's registers); the host
// fallback rounds the same way.
__device__ __forceinline__ float recip(float x) {
#ifdef __CUDA_ARCH__
  return __frcp_rn(x);
#else
  return 1.0f / x;
#endif
}
__device__ __forceinline__ double recip(double x) {
#ifdef __CUDA_ARCH__
  return __drcp_rn(x);
#else
  return 1.0 / x;
#endif
}

__device__ __forceinline__ double load_element(const void* base, int type, int64_t i) {
  if (type == static_cast<int>(ElementType::kBf16)) {
    return static_cast<double>(bits_float(static_cast<uint32_t>(static_cast<const uint16_t*>(base)[i]) << 16));
  }
  return static_cast<double>(static_cast<const float*>(base)[i]);
}

// --- key centre and translation ----------------------------------------------------

// c = bf16(float(sum_j k_j / M)) per column: thread (phase, col) sums rows
// phase, phase + P, ... in FP64, then the P partials are added in phase order.
__global__ void __launch_bounds__(kMetricsThreads) key_centre_kernel(const CentreArgs a) {
  __shared__ double partial[kMetricsThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int phases = kMetricsThreads / a.d, col = tid % a.d, phase = tid / a.d;
  const float* head = a.k + static_cast<int64_t>(blockIdx.x) * a.m * a.d;
  double sum = 0.0;
  if (phase < phases) {
    for (int64_t row = phase; row < a.m; row += phases) sum += static_cast<double>(head[row * a.d + col]);
  }
  partial[tid] = sum;
  __syncthreads();
  if (tid < a.d) {
    double total = 0.0;
    for (int p = 0; p < phases; ++p) total += partial[p * a.d + tid];
    const float mean = a.m > 0 ? static_cast<float>(total / static_cast<double>(a.m)) : 0.0f;
    a.centre[static_cast<int64_t>(blockIdx.x) * a.d + tid] =
        bits_float(static_cast<uint32_t>(bf16_bits_rne(mean)) << 16);
  }
}

// k_out = bf16(k + b), b = -c: k + (-c) and k - c are the same IEEE operation.
__global__ void __launch_bounds__(kMetricsThreads) translate_keys_kernel(const TranslateArgs a) {
  const int64_t stride = a.k_blocks * kMetricsThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kMetricsThreads + threadIdx.x; i < a.kv_total; i += stride) {
    const int64_t head = i / (a.m * a.d);
    const int col = static_cast<int>(i % a.d);
    a.k_out[i] = bf16_bits_rne(a.k[i] - a.centre[head * a.d + col]);
  }
}

// lse_out = float(double(lse) + alpha q.b) with the FP64 dot in the order of
// reference::dot (8 lanes, then the tail, then the lanes), so the products
// (exact in FP64) are summed exactly as the reference sums them.
__global__ void __launch_bounds__(kMetricsThreads) translate_lse_kernel(const TranslateArgs a) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMetricsThreads + threadIdx.x;
  if (row >= a.rows) return;
  const float lse = a.lse[row];
  if (!finite_float(lse)) {
    a.lse_out[row] = lse;
    return;
  }
  const int64_t bh = row / a.n, b = bh / a.hq, h = bh % a.hq, hk = h / (a.hq / a.hkv);
  const float* q = a.q + row * a.d;
  const float* c = a.centre + (b * a.hkv + hk) * a.d;
  constexpr int kLanes = 8;
  double partial[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= a.d; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      partial[l] += static_cast<double>(q[i + l]) * static_cast<double>(-c[i + l]);
    }
  }
  double sum = 0.0;
  for (; i < a.d; ++i) sum += static_cast<double>(q[i]) * static_cast<double>(-c[i]);
  for (int l = 0; l < kLanes; ++l) sum += partial[l];
  a.lse_out[row] = static_cast<float>(static_cast<double>(lse) + a.scale * sum);
}

// --- per-row key geometry -------------------------------------------------------------

// x.y over d (multiple of 4) with explicit FMAs: the two passes, the GPU and
// the emulation all round a logit the same way.
__device__ __forceinline__ float dot_fma(const float* x, const float* y, int d) {
  float acc = 0.0f;
  for (int c = 0; c < d; c += 4) {
    const float4 u = *reinterpret_cast<const float4*>(x + c);
    const float4 v = *reinterpret_cast<const float4*>(y + c);
    acc = fmaf(u.x, v.x, acc);
    acc = fmaf(u.y, v.y, acc);
    acc = fmaf(u.z, v.z, acc);
    acc = fmaf(u.w, v.w, acc);
  }
  return acc;
}

// ||x - y||^2 over d in FP32. mu' (y) rounds to FP32 by ~1e-7 |mu'|, but the
// same rounding for every key: its first-order effect sum_j p_j (k'_j - mu')
// vanishes, so sigma^2 moves only by that rounding squared.
__device__ __forceinline__ float dist2(const float* x, const float* y, int d) {
  float acc = 0.0f;
  for (int c = 0; c < d; c += 4) {
    const float4 u = *reinterpret_cast<const float4*>(x + c);
    const float4 v = *reinterpret_cast<const float4*>(y + c);
    const float e0 = u.x - v.x, e1 = u.y - v.y, e2 = u.z - v.z, e3 = u.w - v.w;
    acc = fmaf(e0, e0, acc);
    acc = fmaf(e1, e1, acc);
    acc = fmaf(e2, e2, acc);
    acc = fmaf(e3, e3, acc);
  }
  return acc;
}

// Row-group reductions: the 16 lanes of a row are 16 consecutive threads of
// one warp, so xor offsets 8..1 stay inside the group (fixed order).
__device__ __forceinline__ float group_max(float x) {
  for (int off = kGeoLanes / 2; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ float group_sum(float x) {
  for (int off = kGeoLanes / 2; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}
// FP64 sum / max over a row's lanes through shared memory (lane order). Every
// thread of the block must call it (two barriers).
__device__ __forceinline__ double group_reduce_double(double* red, double x, bool is_max) {
  const int tid = static_cast<int>(threadIdx.x), base = tid - tid % kGeoLanes;
  red[tid] = x;
  __syncthreads();
  double acc = red[base];
  for (int l = 1; l < kGeoLanes; ++l) acc = is_max ? fmax(acc, red[base + l]) : acc + red[base + l];
  __syncthreads();
  return acc;
}

// keys [j0, j0 + count) of the head as k' = k - c into ks (row stride ld);
// rows past count are zero.
__device__ __forceinline__ void load_centred_keys(float* ks, const float* kh, const float* ch, int64_t j0,
                                                  int64_t count, int d, int ld) {
  const int vec = d / 4;
  for (int idx = static_cast<int>(threadIdx.x); idx < kGeoKeys * vec; idx += kMetricsThreads) {
    const int r = idx / vec, c4 = idx % vec;
    float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
    if (r < count) {
      const float4 x = __ldg(reinterpret_cast<const float4*>(kh + (j0 + r) * d) + c4);
      const float4 c = __ldg(reinterpret_cast<const float4*>(ch) + c4);
      val = make_float4(x.x - c.x, x.y - c.y, x.z - c.z, x.w - c.w);
    }
    *reinterpret_cast<float4*>(ks + r * ld + 4 * c4) = val;
  }
}

// minBlocks 1: with the default, ptxas caps it at 64 registers and spills.
__global__ void __launch_bounds__(kMetricsThreads, 1) geometry_kernel(const GeometryArgs a) {
  GAUGEWATCH_DYNAMIC_SMEM(smem4);
  __shared__ double red[kMetricsThreads];
  __shared__ int row_begin[kGeoRows];
  __shared__ int row_end[kGeoRows];
  const int d = a.d, ld = d + 4;  // +4: float4 rows of consecutive keys hit distinct banks
  float* qs = reinterpret_cast<float*>(smem4);  // kGeoRows x ld
  float* ks = qs + kGeoRows * ld;               // kGeoKeys x ld
  float* mus = ks + kGeoKeys * ld;              // kGeoRows x ld: mu'
  float* ps = mus + kGeoRows * ld;              // kGeoRows x kGeoKeys

  const int tid = static_cast<int>(threadIdx.x), r = tid / kGeoLanes, lane = tid % kGeoLanes;
  const int64_t slice = blockIdx.y, b = slice / a.hq, h = slice % a.hq, hk = h / (a.hq / a.hkv);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kGeoRows, n = n0 + r;
  const bool row_ok = n < a.n;
  KeyRange range{0, 0};
  if (row_ok) range = gpu::visible_keys(a.cu_q, a.cu_k, a.num_segments, a.n, a.m, a.causal, n);
  const bool visible = range.end > range.begin;
  const int64_t mask_row = row_ok ? mask_row_offset(a.mask, b, h, n) : 0;
  const float* kh = a.k + (b * a.hkv + hk) * a.m * d;
  const float* ch = a.centre + (b * a.hkv + hk) * d;
  const int ncols = d / kGeoLanes;

  const int vec = d / 4;
  for (int idx = tid; idx < kGeoRows * vec; idx += kMetricsThreads) {
    const int rr = idx / vec, c4 = idx % vec;
    float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
    if (n0 + rr < a.n) val = __ldg(reinterpret_cast<const float4*>(a.q + ((slice * a.n) + n0 + rr) * d) + c4);
    *reinterpret_cast<float4*>(qs + rr * ld + 4 * c4) = val;
  }
  if (lane == 0) {
    row_begin[r] = visible ? range.begin : INT32_MAX;
    row_end[r] = visible ? range.end : 0;
  }
  __syncthreads();
  // The block's key tiles: the union of its rows' visible ranges.
  int64_t j_begin = INT32_MAX, j_end = 0;
  for (int rr = 0; rr < kGeoRows; ++rr) {
    j_begin = row_begin[rr] < j_begin ? row_begin[rr] : j_begin;
    j_end = row_end[rr] > j_end ? row_end[rr] : j_end;
  }
  // alpha q.c, the row constant the centred logits leave out (FP64).
  double qc_part = 0.0;
  for (int cc = 0; cc < ncols; ++cc) {
    const int col = lane + kGeoLanes * cc;
    qc_part += static_cast<double>(qs[r * ld + col]) * static_cast<double>(ch[col]);
  }
  const double alpha_qc = a.scale * group_reduce_double(red, qc_part, false);

  // Pass 1: online softmax over the centred logits, U = sum exp(s' - m) k'.
  float m_run = -INFINITY, l_part = 0.0f;
  float u[kMaxColsPerLane];
#pragma unroll
  for (int cc = 0; cc < kMaxColsPerLane; ++cc) u[cc] = 0.0f;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kGeoKeys) {
    const int64_t count = j_end - j0 < kGeoKeys ? j_end - j0 : kGeoKeys;
    __syncthreads();  // the previous tile's ks and ps are consumed
    load_centred_keys(ks, kh, ch, j0, count, d, ld);
    __syncthreads();
    float s[kGeoKeysPerLane];
    float tile_max = -INFINITY;
#pragma unroll
    for (int bb = 0; bb < kGeoKeysPerLane; ++bb) {
      const int jj = lane + kGeoLanes * bb;
      const int64_t j = j0 + jj;
      const bool seen = j >= range.begin && j < range.end && mask_allows(a.mask, mask_row, j);
      // attn_mask's bias joins the logit (-inf: masked out).
      s[bb] = seen ? __fadd_rn(__fmul_rn(a.scale_f, dot_fma(qs + r * ld, ks + jj * ld, d)),
                               mask_bias(a.mask, mask_row, j))
                   : -INFINITY;
      tile_max = fmaxf(tile_max, s[bb]);
    }
    tile_max = group_max(tile_max);
    const float m_new = fmaxf(m_run, tile_max);
    // Nothing seen yet (m_new = -inf): no rescale, every p is 0.
    const float rescale = m_new == -INFINITY ? 1.0f : expf(m_run - m_new);
    l_part *= rescale;
#pragma unroll
    for (int bb = 0; bb < kGeoKeysPerLane; ++bb) {
      const float p = s[bb] == -INFINITY ? 0.0f : expf(s[bb] - m_new);
      ps[r * kGeoKeys + lane + kGeoLanes * bb] = p;
      l_part += p;
    }
    m_run = m_new;
    __syncthreads();
#pragma unroll
    for (int cc = 0; cc < kMaxColsPerLane; ++cc) u[cc] *= rescale;
    for (int jj = 0; jj < kGeoKeys; ++jj) {
      const float p = ps[r * kGeoKeys + jj];
      const float* krow = ks + jj * ld + lane;
#pragma unroll
      for (int cc = 0; cc < kMaxColsPerLane; ++cc) {
        if (cc < ncols) u[cc] = fmaf(p, krow[kGeoLanes * cc], u[cc]);
      }
    }
  }
  const float l = group_sum(l_part);
  const float inv_l = l > 0.0f ? recip(l) : 0.0f;
  double offset_part = 0.0;
#pragma unroll
  for (int cc = 0; cc < kMaxColsPerLane; ++cc) {
    if (cc < ncols) {
      const int col = lane + kGeoLanes * cc;
      const float mu_c = u[cc] * inv_l;
      mus[r * ld + col] = mu_c;
      const double full = static_cast<double>(ch[col]) + static_cast<double>(mu_c);  // mu = c + mu'
      offset_part += full * full;
    }
  }
  const double offset2 = group_reduce_double(red, offset_part, false);  // its barriers publish mus

  // Pass 2: sum_j p_j ||k'_j - mu'||^2 with p_j = exp(s' - m) / l in FP64.
  double var_part = 0.0, logit_part = 0.0;
  const double inv_l_d = l > 0.0f ? recip(static_cast<double>(l)) : 0.0;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += kGeoKeys) {
    const int64_t count = j_end - j0 < kGeoKeys ? j_end - j0 : kGeoKeys;
    __syncthreads();
    load_centred_keys(ks, kh, ch, j0, count, d, ld);
    __syncthreads();
#pragma unroll
    for (int bb = 0; bb < kGeoKeysPerLane; ++bb) {
      const int jj = lane + kGeoLanes * bb;
      const int64_t j = j0 + jj;
      if (j >= range.begin && j < range.end && mask_allows(a.mask, mask_row, j)) {
        const float sp = __fadd_rn(__fmul_rn(a.scale_f, dot_fma(qs + r * ld, ks + jj * ld, d)),
                                   mask_bias(a.mask, mask_row, j));
        if (sp == -INFINITY) continue;  // masked out by a -inf bias
        const double w = exp(static_cast<double>(sp) - static_cast<double>(m_run)) * inv_l_d;
        var_part += w * static_cast<double>(dist2(ks + jj * ld, mus + r * ld, d));
        logit_part = fmax(logit_part, fabs(static_cast<double>(sp) + alpha_qc));
      }
    }
  }
  const double var = group_reduce_double(red, var_part, false);
  const double logit = group_reduce_double(red, logit_part, true);
  if (row_ok && lane == 0) {
    const int64_t row = slice * a.n + n;
    const double excluded = bits_double(kExcluded);
    if (visible && l > 0.0f) {
      // sqrt and the ratio in row_finish_kernel (their slow paths are calls)
      a.offset[row] = offset2;
      a.spread[row] = var;
      a.p_max[row] = inv_l_d;  // the largest p is exp(0) / l
      a.logit_max[row] = logit;
    } else {
      a.offset[row] = excluded;
      a.spread[row] = excluded;
      a.p_max[row] = 0.0;
      a.logit_max[row] = 0.0;
    }
  }
}

// offset = sqrt(offset^2), spread = sqrt(var), ratio = offset / spread (a row
// on one key has no spread: its ratio is unbounded and left out).
__global__ void __launch_bounds__(kMetricsThreads) row_finish_kernel(const GeometryArgs a, int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kMetricsThreads + threadIdx.x;
  if (row >= rows) return;
  const double excluded = bits_double(kExcluded);
  if (double_bits(a.offset[row]) == kExcluded) {
    a.ratio[row] = excluded;
    return;
  }
  const double offset = sqrt(a.offset[row]), spread = sqrt(a.spread[row]);
  a.offset[row] = offset;
  a.spread[row] = spread;
  a.ratio[row] = spread > 0.0 ? offset / spread : excluded;
}

// --- reductions ---------------------------------------------------------------------------

// Halving tree over the block (fixed order); `vals` is [count][kMetricsThreads].
// Bit v of sum_mask set: value v is summed, else maximized.
__device__ __forceinline__ void block_tree(double* vals, int count, unsigned sum_mask) {
  const int tid = static_cast<int>(threadIdx.x);
  for (int stride = kMetricsThreads / 2; stride > 0; stride /= 2) {
    __syncthreads();
    if (tid < stride) {
      for (int v = 0; v < count; ++v) {
        double& x = vals[v * kMetricsThreads + tid];
        const double y = vals[v * kMetricsThreads + tid + stride];
        x = ((sum_mask >> v) & 1u) ? x + y : fmax(x, y);
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kMetricsThreads) row_stats_kernel(const RowStatsArgs a) {
  __shared__ double vals[kRowStats * kMetricsThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t chunk = (a.rows + kRowBlocks - 1) / kRowBlocks;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = begin + chunk < a.rows ? begin + chunk : a.rows;
  double acc[kRowStats] = {};  // maxima start at 0: every value is >= 0, and an empty max is 0
  for (int64_t i = begin + tid; i < end; i += kMetricsThreads) {
    if (double_bits(a.offset[i]) == kExcluded) continue;  // no visible key
    const double rho = fabs(static_cast<double>(a.row_mass[i]));
    const double abs_mass = static_cast<double>(a.abs_row_mass[i]);
    const double normalized = abs_mass > 0.0 ? rho / abs_mass : 0.0;
    acc[kStatVisible] += 1.0;
    acc[kStatMassSum] += rho;
    acc[kStatMassMax] = fmax(acc[kStatMassMax], rho);
    acc[kStatOffsetMax] = fmax(acc[kStatOffsetMax], a.offset[i]);
    // A row with no key spread (one visible key, or all of p on one key) has
    // t = 0 in exact arithmetic: its |rho| / sum |t| is 0/0 made 1 by rounding
    // noise, so it is left out of the normalized row mass as of the ratio.
    if (double_bits(a.ratio[i]) != kExcluded) {
      acc[kStatRatioMax] = fmax(acc[kStatRatioMax], a.ratio[i]);
      acc[kStatSpreadRows] += 1.0;
      acc[kStatNormSum] += normalized;
      acc[kStatNormMax] = fmax(acc[kStatNormMax], normalized);
    }
    if (a.p_max[i] > 0.999) acc[kStatSharp] += 1.0;
    acc[kStatLogitMax] = fmax(acc[kStatLogitMax], a.logit_max[i]);
  }
  for (int v = 0; v < kRowStats; ++v) vals[v * kMetricsThreads + tid] = acc[v];
  block_tree(vals, kRowStats, kStatSumMask);
  if (tid < kRowStats) a.partials[static_cast<int64_t>(blockIdx.x) * kRowStats + tid] = vals[tid * kMetricsThreads];
}

__global__ void __launch_bounds__(kMetricsThreads) norms_kernel(const NormArgs a) {
  __shared__ double vals[2 * kMetricsThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const NormJob& job = a.jobs[blockIdx.y];
  const int64_t chunk = (job.count + kNormBlocks - 1) / kNormBlocks;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = begin + chunk < job.count ? begin + chunk : job.count;
  double diff2 = 0.0, norm2 = 0.0;
  if (job.a != nullptr) {
    for (int64_t i = begin + tid; i < end; i += kMetricsThreads) {
      const double x = load_element(job.a, job.type_a, i);
      if (job.b != nullptr) {
        const double y = load_element(job.b, job.type_b, i);
        diff2 += (x - y) * (x - y);
        norm2 += y * y;
      } else {
        diff2 += x * x;
      }
    }
  }
  vals[tid] = diff2;
  vals[kMetricsThreads + tid] = norm2;
  block_tree(vals, 2, 3u);
  if (tid < 2) {
    a.partials[(static_cast<int64_t>(blockIdx.y) * kNormBlocks + blockIdx.x) * 2 + tid] = vals[tid * kMetricsThreads];
  }
}

// The k-th smallest (0-based) of the values' bit patterns, 4 bits a pass from
// the top; excluded rows (all bits set) sort last and are never selected when
// k < the included count. Every thread returns the same value.
__device__ inline uint64_t select_kth(const double* values, int64_t rows, int64_t k, int* counts, uint64_t* shared) {
  const int tid = static_cast<int>(threadIdx.x);
  uint64_t prefix = 0;
  for (int shift = 60; shift >= 0; shift -= 4) {
    const uint64_t high = shift == 60 ? 0 : (~0ull << (shift + 4));
    int local[16] = {};
    for (int64_t i = tid; i < rows; i += kMetricsThreads) {
      const uint64_t x = double_bits(values[i]);
      if ((x & high) == prefix) {
        const int digit = static_cast<int>((x >> shift) & 0xf);
#pragma unroll
        for (int dg = 0; dg < 16; ++dg) local[dg] += digit == dg ? 1 : 0;
      }
    }
#pragma unroll
    for (int dg = 0; dg < 16; ++dg) counts[dg * kMetricsThreads + tid] = local[dg];
    __syncthreads();
    if (tid < 16) {
      int total = 0;
      for (int t = 0; t < kMetricsThreads; ++t) total += counts[tid * kMetricsThreads + t];
      counts[tid * kMetricsThreads] = total;
    }
    __syncthreads();
    if (tid == 0) {
      int64_t below = 0;
      int digit = 15;
      for (int dg = 0; dg < 16; ++dg) {
        const int64_t c = counts[dg * kMetricsThreads];
        if (k < below + c) {
          digit = dg;
          break;
        }
        below += c;
      }
      shared[0] = prefix | (static_cast<uint64_t>(digit) << shift);
      shared[1] = static_cast<uint64_t>(k - below);
    }
    __syncthreads();
    prefix = shared[0];
    k = static_cast<int64_t>(shared[1]);
    __syncthreads();
  }
  return prefix;
}

// Median as reference::median: the middle value, or the mean of the two middle
// values for an even count; 0 when no row is included.
__global__ void __launch_bounds__(kMetricsThreads) medians_kernel(const MedianArgs a) {
  __shared__ int counts[16 * kMetricsThreads];
  __shared__ uint64_t shared[2];
  __shared__ double sums[kMetricsThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const double* values = a.values[blockIdx.x];
  double included = 0.0;
  for (int64_t i = tid; i < a.rows; i += kMetricsThreads) included += double_bits(values[i]) != kExcluded ? 1.0 : 0.0;
  sums[tid] = included;
  block_tree(sums, 1, 1u);
  const int64_t count = static_cast<int64_t>(sums[0]);
  double median = 0.0;
  if (count > 0) {
    const int64_t mid = count / 2;
    const double upper = bits_double(select_kth(values, a.rows, mid, counts, shared));
    if (count % 2 == 1) {
      median = upper;
    } else {
      const double lower = bits_double(select_kth(values, a.rows, mid - 1, counts, shared));
      median = 0.5 * (lower + upper);
    }
  }
  if (tid == 0) a.medians[blockIdx.x] = median;
}

__device__ __forceinline__ double relative(double diff2, double norm2) {
  return norm2 == 0.0 ? sqrt(diff2) : sqrt(diff2 / norm2);
}

// One thread: the partials in block order, then the metrics in MetricId order.
__global__ void finish_kernel(const FinishArgs a) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double s[kRowStats] = {};
  for (int blk = 0; blk < kRowBlocks; ++blk) {
    for (int v = 0; v < kRowStats; ++v) {
      const double x = a.row_partials[blk * kRowStats + v];
      s[v] = ((kStatSumMask >> v) & 1u) ? s[v] + x : fmax(s[v], x);
    }
  }
  double norms[kNormJobs][2] = {};
  for (int job = 0; job < kNormJobs; ++job) {
    for (int blk = 0; blk < kNormBlocks; ++blk) {
      norms[job][0] += a.norm_partials[(job * kNormBlocks + blk) * 2];
      norms[job][1] += a.norm_partials[(job * kNormBlocks + blk) * 2 + 1];
    }
  }
  using M = reference::MetricId;
  auto put = [&](M id, double v) { a.out[static_cast<int>(id)] = v; };
  const double visible = s[kStatVisible];
  put(M::kRowMassAbsMax, s[kStatMassMax]);
  put(M::kRowMassAbsMean, visible > 0.0 ? s[kStatMassSum] / visible : 0.0);
  put(M::kRowMassNormalizedMax, s[kStatNormMax]);
  put(M::kRowMassNormalizedMean, s[kStatSpreadRows] > 0.0 ? s[kStatNormSum] / s[kStatSpreadRows] : 0.0);
  put(M::kKeyOffsetMedian, a.medians[0]);
  put(M::kKeyOffsetMax, s[kStatOffsetMax]);
  put(M::kKeySpreadMedian, a.medians[1]);
  put(M::kKeyOffsetSpreadRatioMedian, a.medians[2]);
  put(M::kKeyOffsetSpreadRatioMax, s[kStatRatioMax]);
  put(M::kKeyRms, a.key_count > 0 ? sqrt(norms[kJobKeySquares][0] / static_cast<double>(a.key_count)) : 0.0);
  put(M::kSharpRowFraction, visible > 0.0 ? s[kStatSharp] / visible : 0.0);
  put(M::kLogitAbsMax, s[kStatLogitMax]);
  put(M::kLiveDqDiscrepancy, relative(norms[kJobLiveDq][0], norms[kJobLiveDq][1]));
  put(M::kLiveDkDiscrepancy, relative(norms[kJobLiveDk][0], norms[kJobLiveDk][1]));
  put(M::kLiveDvDiscrepancy, relative(norms[kJobLiveDv][0], norms[kJobLiveDv][1]));
  put(M::kGprojDqDiscrepancy, relative(norms[kJobGprojDq][0], norms[kJobGprojDq][1]));
  put(M::kGprojDkDiscrepancy, relative(norms[kJobGprojDk][0], norms[kJobGprojDk][1]));
  put(M::kGprojDvDiscrepancy, relative(norms[kJobGprojDv][0], norms[kJobGprojDv][1]));
  put(M::kLiveGaugeViolation, relative(norms[kJobLiveGauge][0], norms[kJobLiveGauge][1]));
  put(M::kGprojGaugeViolation, relative(norms[kJobGprojGauge][0], norms[kJobGprojGauge][1]));
}

}  // namespace gaugewatch::gpu::detail
