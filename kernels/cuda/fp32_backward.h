#pragma once
// Fused FP32 attention backward on the GPU (sm_90): the recompute the monitor
// measures every backend against. Plain C++ API over raw device pointers, so
// tests and the torch op call the same launcher.
//
// Math (docs/numerics.md notation; one batch element, one query head h, key/value
// head h / (Hq / Hkv)); every operand, product and sum is FP32, no TF32:
//   s_ij    = alpha q_i.(k_j - mu)         mu = mean key of the head (center_keys),
//                                          or 0; exact gradients do not change
//   m_i     = max_j s_ij,  l_i = sum_j exp(s_ij - m_i)   (a pre-pass)
//   p_ij    = exp(s_ij - m_i) / l_i        (rows of P sum to 1 to FP32 rounding)
//   a_ij    = u_i.v_j                      (u = dO)
//   delta_i = sum_j p_ij a_ij              (recomputed: the saved BF16 output
//                                          and saved lse are not used)
//   g_ij    = p_ij (a_ij - delta_i)
//   dq_i    = alpha sum_j g_ij (k_j - mu)  dk_j = alpha sum_i g_ij q_i
//   dv_j    = sum_i p_ij u_i
// The same quantities as kernels/reference/fp32_backward.h (backward_fp32).
//
// Layouts (contiguous, row-major, FP32, 16-byte aligned pointers):
//   q, grad_out: (B, Hq, N, d)    k, v: (B, Hkv, M, d)
//   dq: (S, R, d) where S = chosen (batch, head) slices and R = chosen rows;
//       in the full mode S = B * Hq, R = N, so dq is (B, Hq, N, d)
//   dk, dv: (B, Hkv, M, d), every element written (zero where no chosen row
//       sees a key)
// Masking: causal none / top-left (SDPA) / bottom-right (FlashAttention),
// packed sequences through cu_seqlens (S + 1 int32 offsets into N and M,
// applied to every batch element), GQA/MQA (Hkv divides Hq), and SDPA's
// attn_mask (ProblemShape::mask: boolean, or an additive bias on alpha s_ij,
// broadcast by strides; s_ij above then reads alpha q_i.(k_j - mu) + bias_ij,
// formed once and identically in every pass). Rows with no visible key (every
// key masked, or a bias of -inf on each) get zero gradients, as SDPA's math
// and flash paths give. Semantics of kernels/reference/
// attention_problem.h visible_keys(); offsets outside [0, N] / [0, M] are
// clamped on the device (the values are trusted, not validated there).
//
// Row-subset mode (the monitor's sampling): `slices` lists S chosen
// (batch, query head) pairs as flat indices b * Hq + h, `rows` lists R chosen
// query rows (distinct indices along N, in any order, the same rows for every
// slice). Then dq holds only those rows, (S, R, d); dk and dv hold the
// contributions of only those rows (sum over chosen i of g_ij q_i and p_ij u_i),
// not the full key gradients; the softmax statistics of a chosen row still see
// every key the row sees. Cost is proportional to S * R * M * d. A repeated
// slice or row counts twice in dk and dv; an out-of-range one is treated as a
// row with no visible key (zero dq, no contribution).
//
// Passes: (1) mean key per key/value head (center_keys only); (2) per query
// tile, a pass over the row's key tiles for row max, sum and delta (and, in
// deterministic mode, a second pass accumulating dq in registers); (3) per key
// tile, a loop over the query tiles of every query head of the group: dk, dv in
// registers, dq by FP32 atomics (non-deterministic mode). Deterministic mode
// gives bit-identical results run to run.
//
// Build: part of target gaugewatch_cuda (kernels/cuda/CMakeLists.txt, sm_90a).
// Run: tests/cuda/fp32_backward_test.cu (gtest, skips without a GPU).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/problem.h"

namespace gaugewatch::gpu {

struct Fp32BackwardParams {
  ProblemShape shape;  // head_dim 64, 128 or 256
  // Inputs (device, FP32).
  const float* q = nullptr;         // (B, Hq, N, d)
  const float* k = nullptr;         // (B, Hkv, M, d)
  const float* v = nullptr;         // (B, Hkv, M, d)
  const float* grad_out = nullptr;  // (B, Hq, N, d)
  // Outputs (device, FP32).
  float* dq = nullptr;  // (S, R, d); (B, Hq, N, d) in the full mode
  float* dk = nullptr;  // (B, Hkv, M, d)
  float* dv = nullptr;  // (B, Hkv, M, d)

  // Row subset: both null (full mode), or both set (device arrays).
  const int32_t* slices = nullptr;  // (S,) flat b * Hq + h
  int64_t num_slices = 0;
  const int32_t* rows = nullptr;  // (R,) distinct, in [0, N)
  int64_t num_rows = 0;

  bool center_keys = true;
  bool deterministic = false;

  bool subset() const { return slices != nullptr; }
  int64_t slice_count() const { return subset() ? num_slices : shape.batch * shape.q_heads; }
  int64_t row_count() const { return subset() ? num_rows : shape.q_len; }
};

// Checks shapes, head dim, alignment and pointer consistency; no device access.
Status validate(const Fp32BackwardParams& params);

// Device scratch the launch needs (row statistics and mean keys), in bytes.
size_t fp32_backward_workspace_bytes(const Fp32BackwardParams& params);

// Enqueues the backward on `stream`. `workspace` holds at least
// fp32_backward_workspace_bytes(params) bytes of device memory, 16-byte
// aligned. Returns validation errors and launch errors (cudaGetLastError after
// each launch); never synchronizes the stream and never aborts.
Status fp32_attention_backward(const Fp32BackwardParams& params, void* workspace,
                               size_t workspace_bytes, cudaStream_t stream);

}  // namespace gaugewatch::gpu
