#pragma once
// Which keys a query row sees, on the device: visible_keys() of
// kernels/reference/attention_problem.cpp, shared by every CUDA kernel.
// Packed sequences: cu_q/cu_k hold num_segments + 1 offsets into N and M
// (applied to every batch element); offsets outside [0, N] / [0, M] are clamped
// here (device offsets are trusted, not validated). Without packing the whole
// axis is one sequence. A row outside every segment sees nothing.
// The visible range [begin, end) is non-decreasing in both ends along the rows
// of a valid packing, which the kernels use to bound their tile loops; an
// attn_mask only removes pairs inside it (mask_allows) or biases them.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/problem.h"  // CausalMode

namespace gaugewatch::gpu {

struct KeyRange {
  int begin;
  int end;
};

__device__ inline KeyRange visible_keys(const int32_t* cu_q, const int32_t* cu_k, int num_segments, int64_t n,
                                        int64_t m, int causal, int64_t row) {
  int64_t q0 = 0, q1 = n, k0 = 0, k1 = m;
  if (cu_q != nullptr) {
    // Largest segment s with cu_q[s] <= row; empty segments are skipped.
    int lo = 0, hi = num_segments - 1;
    if (hi < 0) return {0, 0};
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (cu_q[mid] <= row) lo = mid; else hi = mid - 1;
    }
    auto clamp = [](int64_t x, int64_t lo_, int64_t hi_) { return x < lo_ ? lo_ : (x > hi_ ? hi_ : x); };
    q0 = clamp(cu_q[lo], 0, n);
    q1 = clamp(cu_q[lo + 1], q0, n);
    k0 = clamp(cu_k[lo], 0, m);
    k1 = clamp(cu_k[lo + 1], k0, m);
    if (row < q0 || row >= q1) return {0, 0};
  }
  const int64_t i = row - q0, nq = q1 - q0, mk = k1 - k0;
  int64_t end = mk;
  if (causal == static_cast<int>(CausalMode::kTopLeft)) {
    end = i + 1 < mk ? i + 1 : mk;
  } else if (causal == static_cast<int>(CausalMode::kBottomRight)) {
    end = i + 1 + mk - nq;
    end = end < 0 ? 0 : (end > mk ? mk : end);
  }
  return {static_cast<int>(k0), static_cast<int>(k0 + end)};
}

// attn_mask (AttentionMask, kernels/cuda/problem.h) of one query row: where
// row (b, h, i) starts in the mask, and whether key j of it takes part / what
// it adds to the scaled logit. A pair takes part when visible_keys() and the
// mask both allow it.
__device__ __forceinline__ int64_t mask_row_offset(const AttentionMask& m, int64_t b, int64_t h, int64_t i) {
  return b * m.strides[0] + h * m.strides[1] + i * m.strides[2];
}

__device__ __forceinline__ bool mask_allows(const AttentionMask& m, int64_t row_offset, int64_t j) {
  return m.kind != MaskKind::kBool || static_cast<const uint8_t*>(m.data)[row_offset + j * m.strides[3]] != 0;
}

__device__ __forceinline__ float mask_bias(const AttentionMask& m, int64_t row_offset, int64_t j) {
  return m.kind == MaskKind::kBias ? static_cast<const float*>(m.data)[row_offset + j * m.strides[3]] : 0.0f;
}

}  // namespace gaugewatch::gpu
