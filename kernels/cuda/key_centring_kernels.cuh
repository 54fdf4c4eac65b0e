#pragma once
// Kernel bodies of key centring (API and the math: kernels/cuda/key_centring.h).
//
//   centring_stats_kernel  grid (splits, B * Hkv): the split's keys, thread
//       (phase, column) sums rows phase, phase + P, ... in FP64; the P partials
//       are added in phase order (fixed: bit-identical run to run)
//   centring_apply_kernel  grid (splits, B * Hkv): kbar from the splits' sums
//       (split order), the split's keys centred, and the split's share of the
//       group's (query head, lse row) pairs shifted, one warp per row
// Plain CUDA the CPU emulation (tests/cuda/emulation) also has; the element
// type is a run-time switch (the kernels are memory-bound), so there is one
// instantiation of each.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/element_bits.cuh"
#include "kernels/cuda/key_centring_args.cuh"

namespace gaugewatch::gpu::detail {

__device__ __forceinline__ float load_as_float(const void* base, int dtype, int64_t i) {
  if (dtype == static_cast<int>(ElementType::kFp32)) return static_cast<const float*>(base)[i];
  const uint16_t bits = static_cast<const uint16_t*>(base)[i];
  return dtype == static_cast<int>(ElementType::kBf16) ? bf16_bits_to_float(bits) : half_bits_to_float(bits);
}

// x rounded to the element type's grid, as a float.
__device__ __forceinline__ float round_to_grid(float x, int dtype) {
  if (dtype == static_cast<int>(ElementType::kBf16)) return bf16_bits_to_float(bf16_bits_rne(x));
  if (dtype == static_cast<int>(ElementType::kFp16)) return half_bits_to_float(half_bits_rne(x));
  return x;
}

__device__ __forceinline__ void store_from_float(void* base, int dtype, int64_t i, float x) {
  if (dtype == static_cast<int>(ElementType::kFp32)) {
    static_cast<float*>(base)[i] = x;
  } else {
    static_cast<uint16_t*>(base)[i] =
        dtype == static_cast<int>(ElementType::kBf16) ? bf16_bits_rne(x) : half_bits_rne(x);
  }
}

// Keys [first, last) of split blockIdx.x.
__device__ __forceinline__ void split_keys(const CentringArgs& a, int64_t& first, int64_t& last) {
  first = static_cast<int64_t>(blockIdx.x) * a.keys_per_split;
  last = first + a.keys_per_split < a.m ? first + a.keys_per_split : a.m;
}

__global__ void __launch_bounds__(kCentringThreads) centring_stats_kernel(const CentringArgs a) {
  __shared__ double sums[kCentringThreads];
  __shared__ double squares[kCentringThreads];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t pair = blockIdx.y, b = pair / a.hkv, hk = pair % a.hkv;
  const int phases = kCentringThreads / a.d, col = tid % a.d, phase = tid / a.d;
  const int64_t head = b * a.k_strides.batch + hk * a.k_strides.head;
  int64_t first = 0, last = 0;
  split_keys(a, first, last);
  double sum = 0.0, square = 0.0;
  if (phase < phases && a.m > 0) {
    const double origin = load_as_float(a.k, a.dtype, head + col);  // k_0c
    for (int64_t j = first + phase; j < last; j += phases) {
      const double x = load_as_float(a.k, a.dtype, head + j * a.k_strides.row + col);
      sum += x;
      square += (x - origin) * (x - origin);
    }
  }
  sums[tid] = sum;
  squares[tid] = square;
  __syncthreads();
  if (tid < a.d) {
    double s = 0.0, q = 0.0;
    for (int p = 0; p < phases; ++p) {
      s += sums[p * a.d + tid];
      q += squares[p * a.d + tid];
    }
    const int64_t at = (pair * a.splits + blockIdx.x) * a.d + tid;
    a.column_sums[at] = s;
    a.column_squares[at] = q;
  }
}

__global__ void __launch_bounds__(kCentringThreads) centring_apply_kernel(const CentringArgs a) {
  __shared__ float kbar[kCentringMaxHeadDim];
  const int tid = static_cast<int>(threadIdx.x);
  const int64_t pair = blockIdx.y, b = pair / a.hkv, hk = pair % a.hkv;
  const int64_t k_head = b * a.k_strides.batch + hk * a.k_strides.head;
  if (tid < a.d) {
    float centre = 0.0f;
    if (a.policy != static_cast<int>(CentringPolicy::kNever) && a.m > 0) {
      double s = 0.0, q = 0.0;
      for (int sp = 0; sp < a.splits; ++sp) {
        s += a.column_sums[(pair * a.splits + sp) * a.d + tid];
        q += a.column_squares[(pair * a.splits + sp) * a.d + tid];
      }
      const double count = static_cast<double>(a.m);
      const double mean = s / count;
      // sum (k - m)^2 = sum (k - k_0)^2 - M (m - k_0)^2.
      const double shift = mean - static_cast<double>(load_as_float(a.k, a.dtype, k_head + tid));
      const double variance = fmax(q / count - shift * shift, 0.0);
      const bool centred = a.policy == static_cast<int>(CentringPolicy::kAlways) ||
                           fabs(mean) > a.ratio * sqrt(variance);
      if (centred) centre = round_to_grid(static_cast<float>(mean), a.dtype);
    }
    kbar[tid] = centre;
    if (blockIdx.x == 0) store_from_float(a.kbar, a.dtype, pair * a.d + tid, centre);
  }
  __syncthreads();

  // The split's keys, centred.
  int64_t first = 0, last = 0;
  split_keys(a, first, last);
  const int64_t out_head = b * a.k_centred_strides.batch + hk * a.k_centred_strides.head;
  for (int64_t idx = first * a.d + tid; idx < last * a.d; idx += kCentringThreads) {
    const int64_t j = idx / a.d;
    const int c = static_cast<int>(idx % a.d);
    const float x = load_as_float(a.k, a.dtype, k_head + j * a.k_strides.row + c);
    store_from_float(a.k_centred, a.dtype, out_head + j * a.k_centred_strides.row + c, x - kbar[c]);
  }

  // The split's share of the group's (query head, lse row) pairs, a warp each.
  const int64_t group = a.hq / a.hkv, rows = group * a.lse_len;
  const int64_t per_split = (rows + a.splits - 1) / a.splits;
  const int64_t row_first = static_cast<int64_t>(blockIdx.x) * per_split;
  const int64_t row_last = row_first + per_split < rows ? row_first + per_split : rows;
  const int warp = tid / 32, lane = tid % 32;
  for (int64_t r = row_first + warp; r < row_last; r += kCentringThreads / 32) {
    const int64_t h = hk * group + r / a.lse_len, i = r % a.lse_len;
    const float lse = a.lse[b * a.lse_strides[0] + h * a.lse_strides[1] + i * a.lse_strides[2]];
    const bool shifted = i < a.n && finite_float(lse);  // the same for every lane
    double dot = 0.0;
    if (shifted) {
      const int64_t q_row = b * a.q_strides.batch + h * a.q_strides.head + i * a.q_strides.row;
      for (int c = lane; c < a.d; c += 32) {
        dot += static_cast<double>(load_as_float(a.q, a.dtype, q_row + c)) * static_cast<double>(kbar[c]);
      }
      for (int off = 16; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
    }
    if (lane == 0) {
      const int64_t at = (b * a.hq + h) * a.lse_len + i;
      a.lse_shifted[at] = shifted ? __fsub_rn(lse, __fmul_rn(a.scale, static_cast<float>(dot))) : lse;
    }
  }
}

}  // namespace gaugewatch::gpu::detail
