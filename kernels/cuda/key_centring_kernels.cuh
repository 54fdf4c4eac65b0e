#pragma once
// Kernel body of key centring (API and the math: kernels/cuda/key_centring.h).
//
//   centring_kernel  grid (cluster, B * Hkv), clusters of (cluster, 1, 1), 256
//       threads; block `rank` (blockIdx.x) owns keys [rank * P, (rank + 1) * P)
//       of its (b, hk) and a share of the group's (query head, lse row) pairs:
//     1. its keys in 16-byte chunks, thread (phase, chunk) takes rows phase,
//        phase + phases, ...: staged in shared memory (up to resident_rows)
//        and summed in FP64; the phases' partials added in phase order
//     2. the cluster meets: every block adds the blocks' column totals in
//        rank order (distributed shared memory) and chooses the same kbar
//     3. its keys written centred, from the stage (rows past resident_rows
//        are read again, a batch of loads in flight per thread)
//     4. its lse rows in tiles of up to 256: the chunks of q where kbar is
//        nonzero staged (coalesced, a batch of loads in flight per thread),
//        then one thread per row adds q_c kbar_c in FP64 in coordinate order
//        and writes the shifted lse; where nothing is centred q is not read
//        and the rows only pass through the same formula with a zero dot
// Plain CUDA plus two cluster primitives that the CPU emulation also has
// (tests/cuda/key_centring_test.cpp): one instantiation, the element type a
// run-time switch (the kernel is memory-bound).

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/element_bits.cuh"
#include "kernels/cuda/key_centring_args.cuh"

#ifdef GAUGEWATCH_CUDA_EMULATION
namespace gaugewatch_emulation {
// The emulated cluster of the calling thread's block (tests/cuda/key_centring_test.cpp).
void cluster_sync();
void* cluster_peer_smem(void* local, int rank);
}  // namespace gaugewatch_emulation
#define GAUGEWATCH_CENTRING_SMEM(name) \
  unsigned char* name = reinterpret_cast<unsigned char*>(gaugewatch_emulation::dynamic_smem())
#else
#include <cooperative_groups.h>
#define GAUGEWATCH_CENTRING_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

namespace gaugewatch::gpu::detail {

#ifdef GAUGEWATCH_CUDA_EMULATION
__device__ __forceinline__ void centring_cluster_sync() { gaugewatch_emulation::cluster_sync(); }
template <class T>
__device__ __forceinline__ T* centring_cluster_peer(T* local, int rank) {
  return static_cast<T*>(gaugewatch_emulation::cluster_peer_smem(local, rank));
}
#else
__device__ __forceinline__ void centring_cluster_sync() { cooperative_groups::this_cluster().sync(); }
template <class T>
__device__ __forceinline__ T* centring_cluster_peer(T* local, int rank) {
  return cooperative_groups::this_cluster().map_shared_rank(local, rank);
}
#endif

// 16 bytes of elements (a vector chunk), or one element in w[0] (the scalar path).
struct alignas(16) CentringChunk {
  uint32_t w[4];
};

__device__ __forceinline__ CentringChunk load_chunk(const void* base, int64_t element, const CentringArgs& a) {
  const char* p = static_cast<const char*>(base) + element * a.esize;
  if (a.vec) return *reinterpret_cast<const CentringChunk*>(p);
  CentringChunk c{};
  c.w[0] = a.esize == 4 ? *reinterpret_cast<const uint32_t*>(p) : *reinterpret_cast<const uint16_t*>(p);
  return c;
}

__device__ __forceinline__ void store_chunk(void* base, int64_t element, const CentringChunk& c,
                                            const CentringArgs& a) {
  char* p = static_cast<char*>(base) + element * a.esize;
  if (a.vec) {
    *reinterpret_cast<CentringChunk*>(p) = c;
  } else if (a.esize == 4) {
    *reinterpret_cast<uint32_t*>(p) = c.w[0];
  } else {
    *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(c.w[0]);
  }
}

// One element as a float (exact).
__device__ __forceinline__ float load_element(const void* base, int64_t element, const CentringArgs& a) {
  const char* p = static_cast<const char*>(base) + element * a.esize;
  if (a.esize == 4) return *reinterpret_cast<const float*>(p);
  const uint16_t bits = *reinterpret_cast<const uint16_t*>(p);
  return a.dtype == static_cast<int>(ElementType::kBf16) ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
}

// Element e of a chunk as a float (exact).
__device__ __forceinline__ float chunk_element(const CentringChunk& c, int e, int dtype) {
  if (dtype == static_cast<int>(ElementType::kFp32)) return bits_float(c.w[e]);
  const uint16_t bits = static_cast<uint16_t>(c.w[e / 2] >> (16 * (e % 2)));
  return dtype == static_cast<int>(ElementType::kBf16) ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
}

// x rounded to the element type's grid, as its bits (FP32: the float's).
__device__ __forceinline__ uint32_t grid_bits(float x, int dtype) {
  if (dtype == static_cast<int>(ElementType::kBf16)) return bf16_bits_rne(x);
  if (dtype == static_cast<int>(ElementType::kFp16)) return half_bits_rne(x);
  return float_bits(x);
}

__device__ __forceinline__ void set_chunk_element(CentringChunk& c, int e, uint32_t bits, int esize) {
  if (esize == 4) {
    c.w[e] = bits;
  } else {
    const int shift = 16 * (e % 2);
    c.w[e / 2] = (c.w[e / 2] & ~(0xffffu << shift)) | (bits << shift);
  }
}

__device__ __forceinline__ float grid_value(float x, int dtype) {
  if (dtype == static_cast<int>(ElementType::kBf16)) return bf16_bits_to_float(bf16_bits_rne(x));
  if (dtype == static_cast<int>(ElementType::kFp16)) return half_bits_to_float(half_bits_rne(x));
  return x;
}

// Rows of keys a thread loads before using them: enough 16-byte loads in
// flight per SM to cover the memory latency with one block per SM.
inline constexpr int kCentringBatch = 8;

// A chunk in the shared-memory stage (same layout as in global memory).
__device__ __forceinline__ void stage_store(unsigned char* at, const CentringChunk& c, const CentringArgs& a) {
  if (a.vec) {
    *reinterpret_cast<CentringChunk*>(at) = c;
  } else if (a.esize == 4) {
    *reinterpret_cast<uint32_t*>(at) = c.w[0];
  } else {
    *reinterpret_cast<uint16_t*>(at) = static_cast<uint16_t>(c.w[0]);
  }
}

__device__ __forceinline__ CentringChunk stage_load(const unsigned char* at, const CentringArgs& a) {
  if (a.vec) return *reinterpret_cast<const CentringChunk*>(at);
  CentringChunk c{};
  c.w[0] = a.esize == 4 ? *reinterpret_cast<const uint32_t*>(at) : *reinterpret_cast<const uint16_t*>(at);
  return c;
}

// Row r of a (b, hk) pair's (query head, lse row) pairs: lse as saved (rows
// past L: 0, the padding of a longer output).
__device__ __forceinline__ float lse_entry(const CentringArgs& a, int64_t b, int64_t hk, int64_t r) {
  const int64_t group = a.hq / a.hkv, h = hk * group + r / a.lse_out_len, i = r % a.lse_out_len;
  return i < a.lse_len ? a.lse[b * a.lse_strides[0] + h * a.lse_strides[1] + i * a.lse_strides[2]] : 0.0f;
}

// lse - scale * float(dot) for rows i < N with a finite lse, else lse as it is.
__device__ __forceinline__ void write_lse_shifted(const CentringArgs& a, int64_t b, int64_t hk, int64_t r, float lse,
                                                  double dot) {
  const int64_t group = a.hq / a.hkv, h = hk * group + r / a.lse_out_len, i = r % a.lse_out_len;
  const bool shifted = i < a.n && finite_float(lse);
  a.lse_shifted[(b * a.hq + h) * a.lse_out_len + i] =
      shifted ? __fsub_rn(lse, __fmul_rn(a.scale, static_cast<float>(dot))) : lse;
}

__global__ void __launch_bounds__(kCentringThreads, 1) centring_kernel(const CentringArgs a) {
  GAUGEWATCH_CENTRING_SMEM(smem);
  unsigned char* stage = smem;
  double* partial_sums = reinterpret_cast<double*>(smem + a.stage_bytes);
  double* partial_squares = partial_sums + kCentringThreads * 8;
  double* totals = reinterpret_cast<double*>(smem + a.stage_bytes + kCentringPartialsBytes);  // sums, then squares
  float* kbar = reinterpret_cast<float*>(smem + a.stage_bytes + kCentringPartialsBytes + kCentringTotalsBytes);
  int* chunk_needed = reinterpret_cast<int*>(smem + a.stage_bytes + kCentringPartialsBytes + kCentringTotalsBytes +
                                             kCentringKbarBytes);

  const int tid = static_cast<int>(threadIdx.x);
  const int rank = static_cast<int>(blockIdx.x);
  const int64_t pair = blockIdx.y, b = pair / a.hkv, hk = pair % a.hkv;
  const int epc = a.vec ? 16 / a.esize : 1;  // elements per chunk (at most 8)
  const int cpr = a.d / epc;                 // chunks per row
  const int phases = kCentringThreads / cpr;
  const int cc = tid % cpr, phase = tid / cpr;
  const bool active = phase < phases;
  const int64_t row_bytes = static_cast<int64_t>(a.d) * a.esize;
  const int64_t chunk_bytes = static_cast<int64_t>(epc) * a.esize;
  const int64_t k_head = b * a.k_strides.batch + hk * a.k_strides.head;
  const int64_t first = rank * a.keys_per_block;
  const int64_t last = first + a.keys_per_block < a.m ? first + a.keys_per_block : a.m;

  // 1. This block's keys: staged and summed.
  double sum[8], square[8], origin[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) sum[e] = square[e] = origin[e] = 0.0;
  if (active && a.m > 0) {
    const CentringChunk k0 = load_chunk(a.k, k_head + static_cast<int64_t>(cc) * epc, a);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (e < epc) origin[e] = chunk_element(k0, e, a.dtype);
    }
    // Software-pipelined: the next batch's loads are in flight while this
    // batch is staged and summed (the FP64 sums cost about as much as the loads).
    const int64_t step = static_cast<int64_t>(phases) * kCentringBatch;
    CentringChunk next[kCentringBatch] = {};
#pragma unroll
    for (int u = 0; u < kCentringBatch; ++u) {
      const int64_t j = first + phase + static_cast<int64_t>(u) * phases;
      if (j < last) next[u] = load_chunk(a.k, k_head + j * a.k_strides.row + static_cast<int64_t>(cc) * epc, a);
    }
    for (int64_t j0 = first + phase; j0 < last; j0 += step) {
      CentringChunk batch[kCentringBatch];
#pragma unroll
      for (int u = 0; u < kCentringBatch; ++u) {
        batch[u] = next[u];
        const int64_t j = j0 + step + static_cast<int64_t>(u) * phases;
        if (j < last) next[u] = load_chunk(a.k, k_head + j * a.k_strides.row + static_cast<int64_t>(cc) * epc, a);
      }
#pragma unroll
      for (int u = 0; u < kCentringBatch; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * phases;
        if (j < last) {
          if (j - first < a.resident_rows) stage_store(stage + (j - first) * row_bytes + cc * chunk_bytes, batch[u], a);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            if (e < epc) {
              const double x = chunk_element(batch[u], e, a.dtype);
              sum[e] += x;
              square[e] += (x - origin[e]) * (x - origin[e]);
            }
          }
        }
      }
    }
  }
  if (active) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (e < epc) {
        partial_sums[phase * a.d + cc * epc + e] = sum[e];
        partial_squares[phase * a.d + cc * epc + e] = square[e];
      }
    }
  }
  __syncthreads();
  if (tid < a.d) {
    double s = 0.0, q = 0.0;
    for (int p = 0; p < phases; ++p) {
      s += partial_sums[p * a.d + tid];
      q += partial_squares[p * a.d + tid];
    }
    totals[tid] = s;
    totals[kCentringMaxHeadDim + tid] = q;
  }

  // 2. The cluster's totals in rank order: every block chooses the same kbar.
  centring_cluster_sync();
  if (tid < a.d) {
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
      const double k0c = load_element(a.k, k_head + tid, a);
      const double shift = mean - k0c;
      const double variance = fmax(q / count - shift * shift, 0.0);
      const bool centred =
          a.policy == static_cast<int>(CentringPolicy::kAlways) || fabs(mean) > a.ratio * sqrt(variance);
      if (centred) centre = grid_value(static_cast<float>(mean), a.dtype);
    }
    kbar[tid] = centre;
    if (rank == 0) {
      char* p = static_cast<char*>(a.kbar) + (pair * a.d + tid) * a.esize;
      if (a.esize == 4) {
        *reinterpret_cast<float*>(p) = centre;
      } else {
        *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(grid_bits(centre, a.dtype));
      }
    }
  }
  // No block leaves or reuses its totals while another may still read them;
  // kbar is visible to the whole block after this.
  centring_cluster_sync();
  if (tid < cpr) {
    int any = 0;
    for (int e = 0; e < epc; ++e) any |= float_bits(kbar[tid * epc + e]) != 0u ? 1 : 0;
    chunk_needed[tid] = any;
  }

  // 3. This block's keys, centred.
  const int64_t out_head = b * a.k_centred_strides.batch + hk * a.k_centred_strides.head;
  if (active) {
    float centre[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) centre[e] = e < epc ? kbar[cc * epc + e] : 0.0f;
    for (int64_t j0 = first + phase; j0 < last; j0 += static_cast<int64_t>(phases) * kCentringBatch) {
      // A batch in registers first: rows past the stage come from L2, their
      // loads in flight together.
      CentringChunk batch[kCentringBatch];
#pragma unroll
      for (int u = 0; u < kCentringBatch; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * phases;
        if (j < last) {
          batch[u] = j - first < a.resident_rows
                         ? stage_load(stage + (j - first) * row_bytes + cc * chunk_bytes, a)
                         : load_chunk(a.k, k_head + j * a.k_strides.row + static_cast<int64_t>(cc) * epc, a);
        }
      }
#pragma unroll
      for (int u = 0; u < kCentringBatch; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * phases;
        if (j < last) {
          CentringChunk& c = batch[u];
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            if (e < epc) {
              set_chunk_element(c, e, grid_bits(chunk_element(c, e, a.dtype) - centre[e], a.dtype), a.esize);
            }
          }
          store_chunk(a.k_centred, out_head + j * a.k_centred_strides.row + static_cast<int64_t>(cc) * epc, c, a);
        }
      }
    }
  }
  __syncthreads();  // chunk_needed written; the stage is free for query tiles

  // 4. This block's share of the group's (query head, lse row) pairs.
  int needed = 0;
  for (int c = 0; c < cpr; ++c) needed += chunk_needed[c];
  const int64_t group = a.hq / a.hkv, rows = group * a.lse_out_len;
  const int64_t per_block = (rows + a.cluster - 1) / a.cluster;
  const int64_t row_first = rank * per_block;
  const int64_t row_last = row_first + per_block < rows ? row_first + per_block : rows;
  if (needed == 0) {
    // Nothing centred: the shift is scale * 0; lse rows loaded a batch at a time.
    for (int64_t r0 = row_first + tid; r0 < row_last; r0 += int64_t{kCentringThreads} * kCentringBatch) {
      float lse[kCentringBatch];
#pragma unroll
      for (int u = 0; u < kCentringBatch; ++u) {
        const int64_t r = r0 + int64_t{u} * kCentringThreads;
        if (r < row_last) lse[u] = lse_entry(a, b, hk, r);
      }
#pragma unroll
      for (int u = 0; u < kCentringBatch; ++u) {
        const int64_t r = r0 + int64_t{u} * kCentringThreads;
        if (r < row_last) write_lse_shifted(a, b, hk, r, lse[u], 0.0);
      }
    }
    return;
  }
  const int64_t q_stride = row_bytes + 16;  // padded: the 16-byte reads of 8 threads hit distinct banks
  int64_t tile = a.stage_bytes / q_stride;
  if (tile > kCentringThreads) tile = kCentringThreads;
  for (int64_t base = row_first; base < row_last; base += tile) {
    const int64_t count = base + tile < row_last ? tile : row_last - base;
    // The row's lse in flight while the tile's q chunks load.
    const float lse = tid < count ? lse_entry(a, b, hk, base + tid) : 0.0f;
    for (int64_t idx0 = tid; idx0 < count * cpr; idx0 += int64_t{kCentringThreads} * kCentringBatch) {
      CentringChunk batch[kCentringBatch];
      bool loaded[kCentringBatch];
#pragma unroll
      for (int u = 0; u < kCentringBatch; ++u) {
        const int64_t idx = idx0 + int64_t{u} * kCentringThreads;
        const int64_t r = base + idx / cpr, h = hk * group + r / a.lse_out_len, i = r % a.lse_out_len;
        const int c = static_cast<int>(idx % cpr);
        loaded[u] = idx < count * cpr && i < a.n && chunk_needed[c] != 0;
        if (loaded[u]) {
          const int64_t q_row = b * a.q_strides.batch + h * a.q_strides.head + i * a.q_strides.row;
          batch[u] = load_chunk(a.q, q_row + static_cast<int64_t>(c) * epc, a);
        }
      }
#pragma unroll
      for (int u = 0; u < kCentringBatch; ++u) {
        const int64_t idx = idx0 + int64_t{u} * kCentringThreads;
        if (loaded[u]) stage_store(stage + (idx / cpr) * q_stride + (idx % cpr) * chunk_bytes, batch[u], a);
      }
    }
    __syncthreads();
    if (tid < count) {
      const int64_t r = base + tid, i = r % a.lse_out_len;
      double dot = 0.0;
      if (i < a.n && finite_float(lse)) {
        const unsigned char* row = stage + static_cast<int64_t>(tid) * q_stride;
        for (int c = 0; c < cpr; ++c) {
          if (!chunk_needed[c]) continue;
          const CentringChunk chunk = stage_load(row + c * chunk_bytes, a);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            if (e < epc) {
              dot += static_cast<double>(chunk_element(chunk, e, a.dtype)) * static_cast<double>(kbar[c * epc + e]);
            }
          }
        }
      }
      write_lse_shifted(a, b, hk, r, lse, dot);
    }
    __syncthreads();  // the tile is read before the next one overwrites it
  }
}

}  // namespace gaugewatch::gpu::detail
