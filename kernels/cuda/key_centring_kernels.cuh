#pragma once
// Kernel bodies of key centring (API and the math: kernels/cuda/key_centring.h;
// the summation order they share with the CPU emulation: key_centring_args.cuh).
// Two launches on one stream:
//
//   centring_sum_kernel<E, kVec>  grid (cluster, B * Hkv), clusters of
//       (cluster, 1, 1), 512 threads, two blocks per SM (20 KiB of shared
//       memory, at most 64 registers). Block `rank` reads its share of the
//       (b, hk)'s keys once, straight from memory: thread (phase, unit) adds
//       its 4-byte word (1 or 2 columns) of every S-th row of each batch of
//       the order, in FP64, the columns of k and of (k - k_0)^2 (k_0 the
//       head's first key, so the squares do not cancel when the offset
//       dominates; exact doubles built from the float's fields,
//       key_centring_elements.cuh), 16 rows' words loaded before they are
//       added (128 B a warp load, coalesced). The block adds its threads'
//       partials per column in phase order; at the cluster barrier rank 0
//       adds the blocks' totals in rank order (distributed shared memory)
//       and writes kbar (the op's output, on k's grid, so it holds the
//       centre exactly).
//   centring_apply_kernel<E, kVec>  grid (apply_blocks, B * Hkv), 256
//       threads, four blocks per SM (4 KiB of shared memory, at most 64
//       registers), after kernel 1 on the stream. A block reads kbar back
//       (d elements), then streams its keys once more: k - kbar in FP32,
//       rounded two elements to a cvt, 16-byte chunks, four loads in flight
//       a thread, each store the chunk it loaded (a chunk whose kbar is all
//       0 is copied); then its (query head, lse row) pairs, query_parts
//       threads a row, each loading its 16-byte chunks of q where kbar is
//       nonzero (four in flight) and adding q_c kbar_c in FP64 (two
//       chains) over every query_parts-th chunk, the parts meeting by warp
//       shuffles (each product is exact in FP64, and so is the sum for BF16
//       and FP16 unless the products' magnitudes span more than ~2^29: the
//       order does not change it); where nothing is centred q is not read.
//       The (b, hk) pairs run in reverse order of kernel 1, so the keys it
//       read last are read first, while L2 may still hold them.
//
// Why two launches (B4 H16 N4096 d128 BF16, offset keys: K 64 MiB, q 64
// MiB): a single launch has to hold a (b, hk)'s keys on chip until kbar is
// known; with 224 KiB of staged keys a block it ran one block per SM, so
// each SM read, summed, waited at the cluster barrier, wrote and shifted in
// turn, never two of these at once (ncu: 25% of DRAM peak, 0.138-0.150 ms
// against a 42 us floor). Kernel 1 only reads K (64 MiB) and kernel 2 reads
// K, q and writes K' (192 MiB): 256 MiB, ~55 us at 4.8 TB/s, each kernel a
// stream with many blocks in flight per SM, whose FP64 work (kernel 1: 16
// loads a thread, ~10 us of issue over the GPU at this shape, counted from
// the source) overlaps the other resident blocks' loads. Random keys
// (nothing centred): 192 MiB. Not measured yet.
//
// Cost per element (BF16, 16-byte path; the per-element code of the
// one-launch kernel, whose SASS was counted): kernel 1 three DFMAs (sum, k - k_0,
// square; exact_double's scaling folds into the first two) and ~6.5 other
// instructions (the float's fields moved into a double, the largest
// exponent tracked), no F2F.F64 (a quarter of the FP64 rate); kernel 2 ~4.5
// instructions per key element, one DFMA and ~4.5 others per centred q
// element. Infinite or NaN operands (rare) take converted re-sums so the
// results stay those of the definition. No run-time type or path switch in
// the hot loops: one instantiation per element type and path (6 a kernel).
// Plain CUDA plus one cvt and two cluster primitives, each with a CPU
// emulation counterpart (key_centring_elements.cuh, element_bits.cuh).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/element_bits.cuh"
#include "kernels/cuda/key_centring_args.cuh"
#include "kernels/cuda/key_centring_elements.cuh"

#ifdef GAUGEWATCH_CUDA_EMULATION
#define GAUGEWATCH_CENTRING_SMEM(name) \
  unsigned char* name = reinterpret_cast<unsigned char*>(gaugewatch_emulation::dynamic_smem())
#else
#define GAUGEWATCH_CENTRING_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace gaugewatch::gpu::detail {

// Row r of a (b, hk) pair's (query head, lse row) pairs: lse as saved (rows
// past L: 0, the padding of a longer output).
__device__ __forceinline__ float lse_entry(const CentringArgs& a, int64_t b, int64_t h, int64_t i) {
  return i < a.lse_len ? a.lse[b * a.lse_strides[0] + h * a.lse_strides[1] + i * a.lse_strides[2]] : 0.0f;
}

// lse - scale * float(dot) for rows i < N with a finite lse, else lse as it is.
__device__ __forceinline__ void write_lse_shifted(const CentringArgs& a, int64_t b, int64_t h, int64_t i, float lse,
                                                  double dot) {
  const bool shifted = i < a.n && finite_float(lse);
  a.lse_shifted[(b * a.hq + h) * a.lse_out_len + i] =
      shifted ? __fsub_rn(lse, __fmul_rn(a.scale, static_cast<float>(dot))) : lse;
}

// What kernel 1 accumulates: column sums (always) or sums and squares about
// k_0 (auto).
enum class CentringStats { kSums, kSumsAndSquares };

// Kernel 1's chains for one thread: word `unit` of every phases-th row of
// each batch of the share (`rows` keys from k_rows), in order.
template <class E, bool kVec, CentringStats kStats>
__device__ __forceinline__ void sum_keys(const CentringArgs& a, const char* k_rows, int64_t rows, double (&sum)[2],
                                         double (&square)[2], const double (&origin)[2]) {
  using Bits = typename E::Bits;
  constexpr int kEsize = static_cast<int>(sizeof(Bits));
  constexpr int kUnitElems = kVec ? 4 / kEsize : 1;
  constexpr int kUnitBytes = kUnitElems * kEsize;
  using Unit = std::conditional_t<kVec, uint32_t, Bits>;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t k_row_stride = a.k_strides.row * kEsize;
  const int upr = a.d / kUnitElems;
  const int sum_phases = kCentringSumThreads / upr, sum_phase = tid / upr, sum_u = tid % upr;
  uint32_t top_exponent = 0;  // the largest exponent field of the keys this thread adds

  if (sum_phase < sum_phases) {
    auto add = [&](Unit unit) {
#pragma unroll
      for (int e = 0; e < kUnitElems; ++e) {
        const float value = E::value(word_element<E>(unit, e));
        top_exponent = top_exponent > exponent_field(value) ? top_exponent : exponent_field(value);
        const double x = exact_double(value);
        sum[e] += x;
        if constexpr (kStats == CentringStats::kSumsAndSquares) {
          const double y = x - origin[e];
          square[e] = fma(y, y, square[e]);
        }
      }
    };
    // Batch by batch; when S divides the batch, a chain is simply every S-th
    // row of the share (one segment), so the loads run ahead across batches.
    const int64_t segment = a.batch_rows % sum_phases == 0 ? rows : a.batch_rows;
    const int64_t step = sum_phases * k_row_stride;
    for (int64_t s0 = 0; s0 < rows; s0 += segment) {
      const int64_t count = s0 + segment < rows ? segment : rows - s0;
      const char* at = k_rows + (s0 + sum_phase) * k_row_stride + sum_u * kUnitBytes;
      constexpr int kSumRows = 16;
      int64_t r = sum_phase;
      for (; r + (kSumRows - 1) * sum_phases < count; r += kSumRows * sum_phases, at += kSumRows * step) {
        Unit units[kSumRows];
#pragma unroll
        for (int u = 0; u < kSumRows; ++u) units[u] = *reinterpret_cast<const Unit*>(at + u * step);
#pragma unroll
        for (int u = 0; u < kSumRows; ++u) add(units[u]);
      }
      for (; r < count; r += sum_phases, at += step) add(*reinterpret_cast<const Unit*>(at));
    }
  }
  // An infinite or NaN key anywhere in the block (exact_double does not
  // carry them): the block's sums again, converted one by one (every
  // sum_phases-th row of the share).
  if (__syncthreads_or(top_exponent == 0x7f800000u)) {
    if (sum_phase < sum_phases) {
      for (int e = 0; e < kUnitElems; ++e) sum[e] = square[e] = 0.0;
      for (int64_t r = sum_phase; r < rows; r += sum_phases) {
        const Unit unit = *reinterpret_cast<const Unit*>(k_rows + r * k_row_stride + sum_u * kUnitBytes);
        for (int e = 0; e < kUnitElems; ++e) {
          const double x = static_cast<double>(E::value(word_element<E>(unit, e)));
          sum[e] += x;
          if constexpr (kStats == CentringStats::kSumsAndSquares) {
            const double y = x - origin[e];
            square[e] = fma(y, y, square[e]);
          }
        }
      }
    }
  }
}

// Kernel 1: launched only where something may be centred (policy always or
// auto, M > 0).
template <class E, bool kVec>
__global__ void __launch_bounds__(kCentringSumThreads, 2) centring_sum_kernel(const CentringArgs a) {
  using Bits = typename E::Bits;
  constexpr int kUnitElems = kVec ? 4 / static_cast<int>(sizeof(Bits)) : 1;
  GAUGEWATCH_CENTRING_SMEM(smem);
  double* partial_sums = reinterpret_cast<double*>(smem);  // [phase][column], kCentringSumThreads * 2 of them
  double* partial_squares = partial_sums + kCentringSumThreads * 2;
  double* totals = reinterpret_cast<double*>(smem + kCentringPartialsBytes);  // sums, then squares

  const int tid = static_cast<int>(threadIdx.x);
  const int rank = static_cast<int>(blockIdx.x);
  const int64_t pair = blockIdx.y, b = pair / a.hkv, hk = pair % a.hkv;
  const int d = a.d;
  const int upr = d / kUnitElems;
  const int64_t k_head = b * a.k_strides.batch + hk * a.k_strides.head;
  const int64_t first = rank * a.keys_per_block;
  const int64_t last = first + a.keys_per_block < a.m ? first + a.keys_per_block : a.m;
  const int64_t rows = last > first ? last - first : 0;
  const Bits* k_elements = static_cast<const Bits*>(a.k);
  const char* k_rows = reinterpret_cast<const char*>(k_elements + k_head + first * a.k_strides.row);
  const bool auto_policy = a.policy == static_cast<int>(CentringPolicy::kAuto);

  // 1. This block's share of the keys, summed.
  const int sum_phases = kCentringSumThreads / upr, sum_phase = tid / upr, sum_u = tid % upr;
  double sum[2] = {0.0, 0.0}, square[2] = {0.0, 0.0}, origin[2] = {0.0, 0.0};
  if (auto_policy && sum_phase < sum_phases) {
#pragma unroll
    for (int e = 0; e < kUnitElems; ++e) origin[e] = E::value(k_elements[k_head + sum_u * kUnitElems + e]);
  }
  if (auto_policy) {
    sum_keys<E, kVec, CentringStats::kSumsAndSquares>(a, k_rows, rows, sum, square, origin);
  } else {
    sum_keys<E, kVec, CentringStats::kSums>(a, k_rows, rows, sum, square, origin);
  }
  if (sum_phase < sum_phases) {
#pragma unroll
    for (int e = 0; e < kUnitElems; ++e) {
      partial_sums[sum_phase * d + sum_u * kUnitElems + e] = sum[e];
      partial_squares[sum_phase * d + sum_u * kUnitElems + e] = square[e];
    }
  }
  __syncthreads();
  if (tid < d) {
    double s = 0.0, q = 0.0;
    for (int p = 0; p < sum_phases; ++p) {
      s += partial_sums[p * d + tid];
      q += partial_squares[p * d + tid];
    }
    totals[tid] = s;
    totals[kCentringMaxHeadDim + tid] = q;
  }

  // 2. The cluster's totals in rank order: rank 0 writes kbar.
  centring_cluster_sync();
  if (tid < d && rank == 0) {
    // Every rank's totals loaded first (distributed shared memory latency
    // overlaps), then added in rank order.
    double peer_sums[kCentringMaxCluster], peer_squares[kCentringMaxCluster];
#pragma unroll
    for (int r = 0; r < kCentringMaxCluster; ++r) {
      if (r < a.cluster) {
        const double* peer = centring_cluster_peer(totals, r);
        peer_sums[r] = peer[tid];
        peer_squares[r] = peer[kCentringMaxHeadDim + tid];
      }
    }
    double s = 0.0, q = 0.0;
#pragma unroll
    for (int r = 0; r < kCentringMaxCluster; ++r) {
      if (r < a.cluster) {
        s += peer_sums[r];
        q += peer_squares[r];
      }
    }
    const double count = static_cast<double>(a.m);
    const double mean = s / count;
    // sum (k - m)^2 = sum (k - k_0)^2 - M (m - k_0)^2.
    const double k0c = E::value(k_elements[k_head + tid]);
    const double shift = mean - k0c;
    // Rounding can leave a tiny negative variance: 0 then. NaN (an infinite
    // or NaN key) stays NaN, so "auto" does not centre the column, as the
    // CPU op's two-pass variance decides.
    const double raw_variance = q / count - shift * shift;
    const double variance = raw_variance < 0.0 ? 0.0 : raw_variance;
    const bool centred = a.policy == static_cast<int>(CentringPolicy::kAlways) || fabs(mean) > a.ratio * sqrt(variance);
    const float centre = centred ? E::value(E::grid_bits(static_cast<float>(mean))) : 0.0f;
    static_cast<Bits*>(a.kbar)[pair * d + tid] = static_cast<Bits>(E::grid_bits(centre));
  }
  // No block leaves while rank 0 may still read its totals.
  centring_cluster_sync();
}

// Kernel 2: keys centred and lse rows shifted with the kbar kernel 1 wrote
// (0 where it did not run).
template <class E, bool kVec>
__global__ void __launch_bounds__(kCentringApplyThreads, 4) centring_apply_kernel(const CentringArgs a) {
  using Bits = typename E::Bits;
  constexpr int kEsize = static_cast<int>(sizeof(Bits));
  constexpr int kChunkElems = kVec ? 16 / kEsize : 1;
  constexpr int kChunkBytes = kChunkElems * kEsize;
  constexpr int kBlockThreads = kCentringApplyThreads;
  GAUGEWATCH_CENTRING_SMEM(smem);
  double* kbar_scaled = reinterpret_cast<double*>(smem);
  float* kbar = reinterpret_cast<float*>(smem + kCentringKbarScaledBytes);
  int* chunk_needed = reinterpret_cast<int*>(smem + kCentringKbarScaledBytes + kCentringKbarBytes);

  const int tid = static_cast<int>(threadIdx.x);
  const int64_t index = blockIdx.x;
  const int64_t pair = a.pairs - 1 - static_cast<int64_t>(blockIdx.y), b = pair / a.hkv, hk = pair % a.hkv;
  const int d = a.d;
  const int cpr = d / kChunkElems;
  Bits* kbar_out = static_cast<Bits*>(a.kbar) + pair * d;
  if (tid < d) {
    // kbar is on k's grid: its stored bits are the centre exactly.
    const float centre = a.sums ? E::value(kbar_out[tid]) : 0.0f;
    kbar[tid] = centre;
    kbar_scaled[tid] = static_cast<double>(centre) * 0x1p896;  // exact: |kbar| < 2^128
    if (!a.sums && index == 0) kbar_out[tid] = static_cast<Bits>(E::grid_bits(0.0f));
  }
  __syncthreads();
  int my_chunk_needed = 0;
  if (tid < cpr) {
    for (int e = 0; e < kChunkElems; ++e) my_chunk_needed |= float_bits(kbar[tid * kChunkElems + e]) != 0u ? 1 : 0;
    chunk_needed[tid] = my_chunk_needed;
  }
  const int needed = __syncthreads_or(my_chunk_needed);  // and chunk_needed visible

  // 3. This block's keys, centred (-0.0 counts as centred: k - (-0) is not k for k = -0).
  const int copy_phases = kBlockThreads / cpr, copy_phase = tid / cpr, copy_c = tid % cpr;
  const int64_t first = index * a.apply_keys;
  const int64_t last = first + a.apply_keys < a.m ? first + a.apply_keys : a.m;
  const int64_t rows = last > first ? last - first : 0;
  if (copy_phase < copy_phases) {
    float centre[kChunkElems];
    bool any = false;
#pragma unroll
    for (int e = 0; e < kChunkElems; ++e) {
      centre[e] = kbar[copy_c * kChunkElems + e];
      any = any || float_bits(centre[e]) != 0u;
    }
    const int64_t k_row_stride = a.k_strides.row * kEsize, out_row_stride = a.k_centred_strides.row * kEsize;
    const char* in_rows = reinterpret_cast<const char*>(static_cast<const Bits*>(a.k) + b * a.k_strides.batch +
                                                        hk * a.k_strides.head + first * a.k_strides.row) +
                          copy_c * kChunkBytes;
    char* out_rows = reinterpret_cast<char*>(static_cast<Bits*>(a.k_centred) + b * a.k_centred_strides.batch +
                                             hk * a.k_centred_strides.head + first * a.k_centred_strides.row) +
                     copy_c * kChunkBytes;
    auto centred = [&](CentringChunk c) {
      if (!any) return c;
      CentringChunk out{};
      if constexpr (kEsize == 4) {
#pragma unroll
        for (int e = 0; e < kChunkElems; ++e) {
          out.w[e] = E::grid_bits(__fsub_rn(E::value(chunk_element<E>(c, e)), centre[e]));
        }
      } else if constexpr (kVec) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          out.w[w] = E::grid_bits2(__fsub_rn(E::value(word_element<E>(c.w[w], 0)), centre[2 * w]),
                                   __fsub_rn(E::value(word_element<E>(c.w[w], 1)), centre[2 * w + 1]));
        }
      } else {
        out.w[0] = E::grid_bits(__fsub_rn(E::value(chunk_element<E>(c, 0)), centre[0]));
      }
      return out;
    };
    constexpr int kInFlight = 4;
    for (int64_t r0 = copy_phase; r0 < rows; r0 += int64_t{copy_phases} * kInFlight) {
      CentringChunk c[kInFlight] = {};
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t r = r0 + int64_t{u} * copy_phases;
        if (r < rows) c[u] = load_chunk<E, kVec>(in_rows + r * k_row_stride);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t r = r0 + int64_t{u} * copy_phases;
        if (r < rows) store_chunk<E, kVec>(out_rows + r * out_row_stride, centred(c[u]));
      }
    }
  }

  // 4. This block's share of the group's (query head, lse row) pairs.
  const int64_t group = a.hq / a.hkv, lse_rows = group * a.lse_out_len;
  const int64_t row_first = index * a.apply_lse_rows;
  const int64_t row_last = row_first + a.apply_lse_rows < lse_rows ? row_first + a.apply_lse_rows : lse_rows;
  if (!needed) {
    // Nothing centred: the shift is scale * 0; lse rows loaded a batch at a time.
    constexpr int kBatch = 8;
    for (int64_t r0 = row_first + tid; r0 < row_last; r0 += int64_t{kBlockThreads} * kBatch) {
      float lse[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t r = r0 + int64_t{u} * kBlockThreads;
        if (r < row_last) lse[u] = lse_entry(a, b, hk * group + r / a.lse_out_len, r % a.lse_out_len);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t r = r0 + int64_t{u} * kBlockThreads;
        if (r < row_last) write_lse_shifted(a, b, hk * group + r / a.lse_out_len, r % a.lse_out_len, lse[u], 0.0);
      }
    }
    return;
  }
  const int parts = a.query_parts, pass_rows = kBlockThreads / parts;
  const int lane_row = tid / parts, part = tid % parts;
  const char* q_elements = static_cast<const char*>(a.q);
  // (query head h, row i) of this thread's pair, advanced pass by pass.
  int64_t h = hk * group + (row_first + lane_row) / a.lse_out_len, i = (row_first + lane_row) % a.lse_out_len;
  for (int64_t base = row_first; base < row_last; base += pass_rows) {
    const int64_t r = base + lane_row;
    const bool row_here = r < row_last;
    const float lse = row_here ? lse_entry(a, b, h, i) : 0.0f;
    // Two chains (even and odd elements) keep the FP64 pipe busy. q_c
    // kbar_c = scaled_double(q_c) * (kbar_c 2^896), exactly; a part that
    // meets an infinite or NaN q_c adds its products again with conversions.
    double dot = 0.0, dot_odd = 0.0;
    if (row_here && i < a.n && finite_float(lse)) {
      const char* q_row = q_elements + (b * a.q_strides.batch + h * a.q_strides.head + i * a.q_strides.row) * kEsize;
      uint32_t top_exponent = 0;
      constexpr int kLoads = kVec ? 4 : 8;
      for (int c0 = part; c0 < cpr; c0 += kLoads * parts) {
        CentringChunk chunk[kLoads] = {};
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const int c = c0 + j * parts;
          if (c < cpr && chunk_needed[c]) chunk[j] = load_chunk<E, kVec>(q_row + c * kChunkBytes);
        }
#pragma unroll
        for (int j = 0; j < kLoads; ++j) {
          const int c = c0 + j * parts;
          if (c < cpr && chunk_needed[c]) {
#pragma unroll
            for (int e = 0; e < kChunkElems; ++e) {
              const float value = E::value(chunk_element<E>(chunk[j], e));
              top_exponent = top_exponent > exponent_field(value) ? top_exponent : exponent_field(value);
              if (e % 2 == 0) {
                dot = fma(scaled_double(value), kbar_scaled[c * kChunkElems + e], dot);
              } else {
                dot_odd = fma(scaled_double(value), kbar_scaled[c * kChunkElems + e], dot_odd);
              }
            }
          }
        }
      }
      if (top_exponent == 0x7f800000u) {
        dot = dot_odd = 0.0;
        for (int c = part; c < cpr; c += parts) {
          if (!chunk_needed[c]) continue;
          const CentringChunk chunk = load_chunk<E, kVec>(q_row + c * kChunkBytes);
          for (int e = 0; e < kChunkElems; ++e) {
            dot = fma(static_cast<double>(E::value(chunk_element<E>(chunk, e))),
                      kbar_scaled[c * kChunkElems + e] * 0x1p-896, dot);
          }
        }
      }
    }
    dot += dot_odd;
    for (int offset = parts / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    if (row_here && part == 0) write_lse_shifted(a, b, h, i, lse, dot);
    for (i += pass_rows; i >= a.lse_out_len && row_here; i -= a.lse_out_len) ++h;
  }
}

// The instantiations for the launch's element type and path.
using CentringKernel = void (*)(CentringArgs);
struct CentringKernels {
  CentringKernel sum, apply;
};
template <class E>
inline CentringKernels centring_kernels_of(bool vec) {
  if (vec) return {&centring_sum_kernel<E, true>, &centring_apply_kernel<E, true>};
  return {&centring_sum_kernel<E, false>, &centring_apply_kernel<E, false>};
}
inline CentringKernels centring_kernels_for(const CentringArgs& a) {
  switch (static_cast<ElementType>(a.dtype)) {
    case ElementType::kBf16: return centring_kernels_of<CentringBf16>(a.vec != 0);
    case ElementType::kFp16: return centring_kernels_of<CentringFp16>(a.vec != 0);
    default: return centring_kernels_of<CentringFp32>(a.vec != 0);
  }
}

}  // namespace gaugewatch::gpu::detail
