#pragma once
// Kernel body of key centring (API and the math: kernels/cuda/key_centring.h).
//
//   centring_kernel<E, kVec>  grid (cluster, B * Hkv), clusters of (cluster,
//       1, 1), 512 threads, one block per SM (kCentringSmemBytes of shared
//       memory); E the element type (BF16, FP16, FP32), kVec the 16-byte path
//       (rows and pointers 16-byte aligned) or one element at a time. Block
//       `rank` (blockIdx.x) owns keys [rank * P, (rank + 1) * P) of its
//       (b, hk) and a share of the group's (query head, lse row) pairs:
//     1. its keys in batches of ~16 KiB: each batch copied to shared memory
//        (cp.async, three batches loading ahead; 16-byte chunks, thread
//        (phase, chunk) takes every phases-th row), then, after a barrier,
//        summed by 4-byte words: thread (phase, word) adds its 1 or 2
//        columns of k and of (k - k_0)^2 in FP64 (k_0 the head's first key,
//        so the squares do not cancel when the offset dominates; exact
//        doubles built from the float's fields, key_centring_elements.cuh),
//        8 rows' words loaded before they are added. Batches up to
//        resident_rows stay in the stage; later ones (only when a share
//        exceeds the stage) pass through a ring of kCentringDepth batches.
//        Each thread's FP64 partials are added per column in phase order.
//     2. the cluster meets: every block adds the blocks' column totals in
//        rank order (distributed shared memory) and chooses the same kbar
//     3. its keys written centred, 16-byte chunk by chunk, four in flight a
//        thread: the rows that passed through the ring read again first
//        (still in L2), then the staged rows; k - kbar in FP32, rounded two
//        elements to a cvt; a thread whose chunk has kbar all zero copies
//        the bits
//     4. its lse rows in double-buffered query tiles (tile 0 beside the
//        staged keys when it fits there, loading during step 3): the chunks
//        of q where kbar is nonzero copied in (cp.async), then query_parts
//        threads per row each add q_c kbar_c in FP64 (two chains) over
//        every query_parts-th chunk and the parts meet by warp shuffles
//        (each product is exact in FP64, and so is the sum for BF16 and
//        FP16 unless the products' magnitudes span more than ~2^29: the
//        order does not change it); where nothing is centred q is not read
//        and the rows only pass through the same formula with a zero dot.
// Cost per element (BF16, 16-byte path, counted in the SASS): step 1 three
// DFMAs (sum, k - k_0, square; exact_double's scaling folds into the first
// two) and ~6.5 other instructions (moving the float's fields into a double,
// tracking the largest exponent, shared-memory loads), no F2F.F64 (a quarter
// of the FP64 rate); step 3 ~4.5 instructions; step 4 one DFMA and ~4.5
// others per centred q element. Infinite or NaN operands (rare) take
// converted re-sums so the results stay those of the definition. 16 warps
// per SM (76-86 registers, 224 KiB of shared memory) keep the loads of many
// rows in flight. No run-time type or path switch in the hot loops: one
// instantiation per element type and path (6). Plain CUDA plus cp.async, one cvt and two cluster primitives,
// each with a CPU emulation counterpart (key_centring_elements.cuh,
// element_bits.cuh).

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

// What step 1 accumulates: nothing (policy never), column sums (always), or
// sums and squares about k_0 (auto).
enum class CentringStats { kNone, kSums, kSumsAndSquares };

// Step 1 for one block: copies its keys into the stage batch by batch and
// accumulates this thread's columns (word `unit` of every phases-th row).
template <class E, bool kVec, CentringStats kStats>
__device__ __forceinline__ void stage_and_sum_keys(const CentringArgs& a, unsigned char* stage, const char* k_rows,
                                                   int64_t rows, double (&sum)[2], double (&square)[2],
                                                   const double (&origin)[2]) {
  using Bits = typename E::Bits;
  constexpr int kEsize = static_cast<int>(sizeof(Bits));
  constexpr int kChunkBytes = kVec ? 16 : kEsize;
  constexpr int kUnitElems = kVec ? 4 / kEsize : 1;
  constexpr int kUnitBytes = kUnitElems * kEsize;
  using Unit = std::conditional_t<kVec, uint32_t, Bits>;
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t row_bytes = static_cast<int64_t>(a.d) * kEsize;
  const int64_t k_row_stride = a.k_strides.row * kEsize;
  const int cpr = static_cast<int>(row_bytes / kChunkBytes), upr = a.d / kUnitElems;
  const int copy_phases = kCentringThreads / cpr, copy_phase = tid / cpr, copy_c = tid % cpr;
  const int sum_phases = kCentringThreads / upr, sum_phase = tid / upr, sum_u = tid % upr;
  const int64_t batch_rows = a.batch_rows, resident = a.resident_rows;
  const int64_t batches = (rows + batch_rows - 1) / batch_rows;
  uint32_t top_exponent = 0;  // the largest exponent field of the keys this thread adds

  auto batch_at = [&](int64_t t) -> unsigned char* {
    const int64_t r0 = t * batch_rows;
    if (r0 < resident) return stage + r0 * row_bytes;
    return stage + (resident + ((t - resident / batch_rows) % kCentringDepth) * batch_rows) * row_bytes;
  };
  auto issue = [&](int64_t t) {
    if (t < batches && copy_phase < copy_phases) {
      const int64_t r0 = t * batch_rows, count = r0 + batch_rows < rows ? batch_rows : rows - r0;
      unsigned char* dst = batch_at(t) + copy_c * kChunkBytes;
      const char* src = k_rows + r0 * k_row_stride + copy_c * kChunkBytes;
      for (int64_t r = copy_phase; r < count; r += copy_phases) {
        if constexpr (kVec) {
          centring_copy_16(dst + r * row_bytes, src + r * k_row_stride);
        } else {
          *reinterpret_cast<Bits*>(dst + r * row_bytes) = *reinterpret_cast<const Bits*>(src + r * k_row_stride);
        }
      }
    }
    centring_copy_commit();  // every thread commits a group per batch, empty or not
  };

  for (int t = 0; t < kCentringDepth - 1; ++t) issue(t);
  for (int64_t t = 0; t < batches; ++t) {
    centring_copy_wait<kCentringDepth - 2>();  // this thread's copies of batch t
    __syncthreads();  // everyone's; and every thread is past batch t - 1, whose ring slot t + depth - 1 reuses
    issue(t + kCentringDepth - 1);
    if constexpr (kStats != CentringStats::kNone) {
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
        // This thread's rows of the batch, kSumRows loads in flight at a time.
        const int count = static_cast<int>(t * batch_rows + batch_rows < rows ? batch_rows : rows - t * batch_rows);
        const int step = sum_phases * static_cast<int>(row_bytes);
        const unsigned char* at = batch_at(t) + sum_u * kUnitBytes + sum_phase * static_cast<int>(row_bytes);
        constexpr int kSumRows = 8;
        int r = sum_phase;
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
  }
  if constexpr (kStats != CentringStats::kNone) {
    // An infinite or NaN key anywhere in the block (exact_double does not
    // carry them): the block's sums again from memory, converted one by one.
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
  centring_copy_wait<0>();  // nothing left in flight (the trailing groups are empty)
}

template <class E, bool kVec>
__global__ void __launch_bounds__(kCentringThreads, 1) centring_kernel(const CentringArgs a) {
  using Bits = typename E::Bits;
  constexpr int kEsize = static_cast<int>(sizeof(Bits));
  constexpr int kChunkElems = kVec ? 16 / kEsize : 1;
  constexpr int kChunkBytes = kChunkElems * kEsize;
  constexpr int kUnitElems = kVec ? 4 / kEsize : 1;
  constexpr int kBlockThreads = kCentringThreads;
  GAUGEWATCH_CENTRING_SMEM(smem);
  unsigned char* stage = smem;
  unsigned char* fixed = smem + kCentringStageBytes;
  double* partial_sums = reinterpret_cast<double*>(fixed);  // [phase][column], kBlockThreads * 2 of them
  double* partial_squares = partial_sums + kBlockThreads * 2;
  double* totals = reinterpret_cast<double*>(fixed + kCentringPartialsBytes);  // sums, then squares
  float* kbar = reinterpret_cast<float*>(fixed + kCentringPartialsBytes + kCentringTotalsBytes);
  double* kbar_scaled =
      reinterpret_cast<double*>(fixed + kCentringPartialsBytes + kCentringTotalsBytes + kCentringKbarBytes);
  int* chunk_needed = reinterpret_cast<int*>(fixed + kCentringPartialsBytes + kCentringTotalsBytes +
                                             kCentringKbarBytes + kCentringKbarScaledBytes);

  const int tid = static_cast<int>(threadIdx.x);
  const int rank = static_cast<int>(blockIdx.x);
  const int64_t pair = blockIdx.y, b = pair / a.hkv, hk = pair % a.hkv;
  const int d = a.d;
  const int64_t row_bytes = static_cast<int64_t>(d) * kEsize;
  const int cpr = d / kChunkElems, upr = d / kUnitElems;
  const int64_t k_head = b * a.k_strides.batch + hk * a.k_strides.head;
  const int64_t first = rank * a.keys_per_block;
  const int64_t last = first + a.keys_per_block < a.m ? first + a.keys_per_block : a.m;
  const int64_t rows = last > first ? last - first : 0;
  const Bits* k_elements = static_cast<const Bits*>(a.k);
  const char* k_rows = reinterpret_cast<const char*>(k_elements + k_head + first * a.k_strides.row);

  // 1. This block's keys: staged and summed.
  const int sum_phases = kBlockThreads / upr, sum_phase = tid / upr, sum_u = tid % upr;
  double sum[2] = {0.0, 0.0}, square[2] = {0.0, 0.0}, origin[2] = {0.0, 0.0};
  if (a.policy == static_cast<int>(CentringPolicy::kAuto) && a.m > 0 && sum_phase < sum_phases) {
#pragma unroll
    for (int e = 0; e < kUnitElems; ++e) origin[e] = E::value(k_elements[k_head + sum_u * kUnitElems + e]);
  }
  if (a.policy == static_cast<int>(CentringPolicy::kAuto)) {
    stage_and_sum_keys<E, kVec, CentringStats::kSumsAndSquares>(a, stage, k_rows, rows, sum, square, origin);
  } else if (a.policy == static_cast<int>(CentringPolicy::kAlways)) {
    stage_and_sum_keys<E, kVec, CentringStats::kSums>(a, stage, k_rows, rows, sum, square, origin);
  } else {
    stage_and_sum_keys<E, kVec, CentringStats::kNone>(a, stage, k_rows, rows, sum, square, origin);
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

  // 2. The cluster's totals in rank order: every block chooses the same kbar.
  centring_cluster_sync();
  if (tid < d) {
    float centre = 0.0f;
    if (a.policy != static_cast<int>(CentringPolicy::kNever) && a.m > 0) {
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
      const bool centred =
          a.policy == static_cast<int>(CentringPolicy::kAlways) || fabs(mean) > a.ratio * sqrt(variance);
      if (centred) centre = E::value(E::grid_bits(static_cast<float>(mean)));
    }
    kbar[tid] = centre;
    kbar_scaled[tid] = static_cast<double>(centre) * 0x1p896;  // exact: |kbar| < 2^128
    if (rank == 0) static_cast<Bits*>(a.kbar)[pair * d + tid] = static_cast<Bits>(E::grid_bits(centre));
  }
  // No block leaves or reuses its totals while another may still read them;
  // kbar is visible to the whole block after this.
  centring_cluster_sync();
  int my_chunk_needed = 0;
  if (tid < cpr) {
    for (int e = 0; e < kChunkElems; ++e) my_chunk_needed |= float_bits(kbar[tid * kChunkElems + e]) != 0u ? 1 : 0;
    chunk_needed[tid] = my_chunk_needed;
  }

  const int needed = __syncthreads_or(my_chunk_needed);  // and chunk_needed visible
  const int copy_phases = kBlockThreads / cpr, copy_phase = tid / cpr, copy_c = tid % cpr;

  // Step 4's share: the group's (query head, lse row) pairs of this block.
  const int64_t group = a.hq / a.hkv, lse_rows = group * a.lse_out_len;
  const int64_t per_block = (lse_rows + a.cluster - 1) / a.cluster;
  const int64_t row_first = rank * per_block;
  const int64_t row_last = row_first + per_block < lse_rows ? row_first + per_block : lse_rows;
  const int64_t tile_rows = a.query_tile_rows, q_stride = a.query_stride;
  const int parts = a.query_parts;
  const int64_t tiles = row_last > row_first ? (row_last - row_first + tile_rows - 1) / tile_rows : 0;
  const int64_t q_row_stride = a.q_strides.row * kEsize;
  const char* q_elements = static_cast<const char*>(a.q);
  // Two tile buffers. When one fits beside the staged keys, tile 0 goes
  // there and loads while step 3 still reads the keys (odd tiles take the
  // stage's start, free after step 3); else both follow step 3.
  const int64_t tile_bytes = tile_rows * q_stride;
  const int64_t kept = rows < a.resident_rows ? rows : a.resident_rows;
  const int64_t keys_end = (kept * row_bytes + 15) / 16 * 16;
  const int64_t beside = keys_end > tile_bytes ? keys_end : tile_bytes;
  const bool early = beside + tile_bytes <= kCentringStageBytes;
  auto tile_at = [&](int64_t t) {
    if (early) return t % 2 == 0 ? stage + beside : stage;
    return stage + (t % 2) * tile_bytes;
  };
  auto issue_tile = [&](int64_t t) {
    if (t < tiles && copy_phase < copy_phases && chunk_needed[copy_c]) {
      const int64_t base = row_first + t * tile_rows;
      const int64_t count = base + tile_rows < row_last ? tile_rows : row_last - base;
      unsigned char* dst = tile_at(t) + copy_c * kChunkBytes;
      int64_t r = base + copy_phase;
      int64_t h = hk * group + r / a.lse_out_len, i = r % a.lse_out_len;
      for (int64_t row = copy_phase; row < count; row += copy_phases) {
        if (i < a.n) {
          const char* src = q_elements + (b * a.q_strides.batch + h * a.q_strides.head) * kEsize + i * q_row_stride +
                            copy_c * kChunkBytes;
          if constexpr (kVec) {
            centring_copy_16(dst + row * q_stride, src);
          } else {
            *reinterpret_cast<Bits*>(dst + row * q_stride) = *reinterpret_cast<const Bits*>(src);
          }
        }
        i += copy_phases;
        while (i >= a.lse_out_len) {
          i -= a.lse_out_len;
          ++h;
        }
      }
    }
    centring_copy_commit();
  };
  if (needed && early) issue_tile(0);

  // 3. This block's keys, centred (-0.0 counts as centred: k - (-0) is not k for k = -0).
  if (copy_phase < copy_phases) {
    float centre[kChunkElems];
    bool any = false;
#pragma unroll
    for (int e = 0; e < kChunkElems; ++e) {
      centre[e] = kbar[copy_c * kChunkElems + e];
      any = any || float_bits(centre[e]) != 0u;
    }
    const int64_t k_row_stride = a.k_strides.row * kEsize, out_row_stride = a.k_centred_strides.row * kEsize;
    char* out_rows = reinterpret_cast<char*>(static_cast<Bits*>(a.k_centred) + b * a.k_centred_strides.batch +
                                             hk * a.k_centred_strides.head + first * a.k_centred_strides.row) +
                     copy_c * kChunkBytes;
    const char* in_rows = k_rows + copy_c * kChunkBytes;
    const unsigned char* staged = stage + copy_c * kChunkBytes;
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
    auto write_rows = [&](int64_t from, int64_t to, bool from_stage) {
      for (int64_t r0 = from + copy_phase; r0 < to; r0 += int64_t{copy_phases} * kInFlight) {
        CentringChunk c[kInFlight] = {};
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          const int64_t r = r0 + int64_t{u} * copy_phases;
          if (r < to) {
            c[u] = from_stage ? load_chunk<E, kVec>(staged + r * row_bytes)
                              : load_chunk<E, kVec>(in_rows + r * k_row_stride);
          }
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          const int64_t r = r0 + int64_t{u} * copy_phases;
          if (r < to) store_chunk<E, kVec>(out_rows + r * out_row_stride, centred(c[u]));
        }
      }
    };
    write_rows(kept, rows, false);  // rows that passed through the ring: read again
    write_rows(0, kept, true);
  }

  // 4. This block's share of the group's (query head, lse row) pairs.
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
  if (!early) {
    __syncthreads();  // every thread is done with the staged keys
    issue_tile(0);
  }
  const int tile_row = tid / parts, part = tid % parts;
  for (int64_t t = 0; t < tiles; ++t) {
    __syncthreads();  // every thread is done with tile t - 1, whose buffer tile t + 1 takes
    issue_tile(t + 1);
    const int64_t r = row_first + t * tile_rows + tile_row;
    const int64_t h = hk * group + r / a.lse_out_len, i = r % a.lse_out_len;
    const bool row_here = tile_row < tile_rows && r < row_last;
    const float lse = row_here ? lse_entry(a, b, h, i) : 0.0f;  // in flight while the tile lands
    centring_copy_wait<1>();
    __syncthreads();
    // Two chains (even and odd elements) keep the FP64 pipe busy. q_c
    // kbar_c = scaled_double(q_c) * (kbar_c 2^896), exactly; a part that
    // meets an infinite or NaN q_c adds its products again with conversions.
    double dot = 0.0, dot_odd = 0.0;
    if (row_here && i < a.n && finite_float(lse)) {
      const unsigned char* q_row = tile_at(t) + tile_row * q_stride;
      uint32_t top_exponent = 0;
      for (int c = part; c < cpr; c += parts) {
        if (!chunk_needed[c]) continue;
        const CentringChunk chunk = load_chunk<E, kVec>(q_row + c * kChunkBytes);
#pragma unroll
        for (int e = 0; e < kChunkElems; ++e) {
          const float value = E::value(chunk_element<E>(chunk, e));
          top_exponent = top_exponent > exponent_field(value) ? top_exponent : exponent_field(value);
          if (e % 2 == 0) {
            dot = fma(scaled_double(value), kbar_scaled[c * kChunkElems + e], dot);
          } else {
            dot_odd = fma(scaled_double(value), kbar_scaled[c * kChunkElems + e], dot_odd);
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
  }
  centring_copy_wait<0>();
}

// The instantiation for the launch's element type and path.
using CentringKernel = void (*)(CentringArgs);
template <class E>
inline CentringKernel centring_kernel_of(bool vec) {
  return vec ? &centring_kernel<E, true> : &centring_kernel<E, false>;
}
inline CentringKernel centring_kernel_for(const CentringArgs& a) {
  switch (static_cast<ElementType>(a.dtype)) {
    case ElementType::kBf16: return centring_kernel_of<CentringBf16>(a.vec != 0);
    case ElementType::kFp16: return centring_kernel_of<CentringFp16>(a.vec != 0);
    default: return centring_kernel_of<CentringFp32>(a.vec != 0);
  }
}

}  // namespace gaugewatch::gpu::detail
