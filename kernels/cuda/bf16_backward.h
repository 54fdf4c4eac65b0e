#pragma once
// Fused BF16 attention backward on the GPU (sm_90), three variants of one
// kernel pair: "bf16" (what FlashAttention/cuDNN compute), "gproj" and
// "pivot" (NUMERICS.md). BF16 operands, FP32 accumulators, BF16 outputs.
//
// Math (NUMERICS.md notation; one batch element, query head h, key/value head
// h / (Hq / Hkv); alpha = scale; every product below is a BF16 x BF16 tensor
// core MMA with FP32 accumulation unless stated):
//   delta_i = sum_c dO_ic O_ic               FP32, from the saved BF16 output
//   s_ij    = q_i . k_j                      (MMA)
//   P_ij    = exp2(s_ij alpha log2e - lse_i log2e)    FP32, from the saved lse
//   dP_ij   = dO_i . v_j                     (MMA)
//   t_ij    = bf16(P_ij (dP_ij - delta_i)),  r_ij = bf16(P_ij)
//   dV_j    = sum_i r_ij dO_i                dK_j = alpha sum_i t_ij q_i
//   dQ_i    = alpha sum_j t_ij k_j
// gproj: rho_i = sum_j t_ij, m_i = sum_j r_ij (FP32 sums of the BF16 values
//   the MMAs consume), lambda_i = rho_i / m_i (0 when m_i = 0), and
//   dQ'_i = alpha (sum_j t_ij k_j - lambda_i sum_j r_ij k_j)
//   dK'_j = alpha (sum_i t_ij q_i - sum_i r_ij bf16(lambda_i q_i))
//   i.e. the contraction of t' = t - lambda r, whose row sums are zero.
// pivot: j*(i) = argmax_j P_ij (ties to the lower j), and
//   dQ'_i = alpha (sum_j t_ij k_j - rho_i k_{j*(i)})
//   dK'_j = alpha (sum_i t_ij q_i - sum_{i : j*(i) = j} rho_i q_i)   (FP32)
//
// Structure (chosen by counting products, see kernels/cuda/README.md): a
// delta pre-pass; a query-outer kernel (per query tile, loop over key tiles:
// S, dP, t, r, dQ += t K, and for gproj U += r K and the row sums), which
// finishes dQ and writes lambda (gproj) or rho and j* (pivot) per row; then a
// key-outer kernel (per key tile, loop over the query tiles of every query
// head of its group: S, dP, t, r recomputed by the same code, dV += r^T dO,
// dK += t^T Q, for gproj dK -= r^T bf16(lambda Q), for pivot the O(N d)
// rank-one fix-up). No atomics anywhere: every run is bit-identical, so the
// ops' "deterministic" flag needs no parameter here. Both kernels compute
// S and dP with the same instructions in the same order, so the t and r the
// key-outer kernel contracts are bit-identical to those summed into rho and m.
// Two implementations of the pair: the Hopper pair (warpgroup MMAs,
// bf16_backward_hopper.cuh; the default) and the mma.sync pair
// (bf16_backward_kernel.cuh; GAUGEWATCH_BF16_KERNEL=mma_sync). For gproj the
// Hopper dq kernel also writes bf16(-lambda_i q_i) per row to the workspace,
// which its dkdv kernel stages like Q.
//
// Layouts: q, grad_out, out: (B, Hq, N, d); k, v: (B, Hkv, M, d); BF16, last
// dim contiguous, other strides free (SDPA's (B, N, H, d) views work), rows
// 16-byte aligned. lse: FP32 (B, Hq, N) natural-log, any batch/head strides,
// row stride 1 (cuDNN's (B, H, N, 1) is the same memory). dq, dk, dv: BF16,
// contiguous (B, Hq, N, d) / (B, Hkv, M, d). Masking, packing, GQA and rows
// with no visible key exactly as kernels/cuda/fp32_backward.h.
//
// Row diagnostics (optional, each FP32 (B, Hq, N) contiguous, null to skip;
// projection kNone only, so the projected variants spend no registers on them):
// the quantities the monitor's row-mass, sharpness and pivot metrics need,
// computed from the same t, r and P the MMAs consume.
//
// Build: target gaugewatch_cuda (sm_90a). Tests: tests/cuda/bf16_backward_test.cu.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/fp32_backward.h"  // CausalMode, Status

namespace gaugewatch::gpu {

enum class Projection : int {
  kNone = 0,   // backend "bf16": the stock fused kernels' arithmetic
  kGproj = 1,  // backend "gproj"
  kPivot = 2,  // backend "pivot"
};

struct Bf16RowDiagnostics {
  float* row_mass = nullptr;       // rho_i = sum_j t_ij
  float* abs_row_mass = nullptr;   // sum_j |t_ij|
  float* prob_mass = nullptr;      // m_i = sum_j r_ij
  float* p_max = nullptr;          // max_j P_ij
  float* logit_abs_max = nullptr;  // max_j |alpha s_ij| over visible keys
  int32_t* pivot = nullptr;        // j*(i) along M, -1 for rows with no key
  __host__ __device__ bool any() const {
    return row_mass || abs_row_mass || prob_mass || p_max || logit_abs_max || pivot;
  }
};

struct Bf16BackwardParams {
  // Inputs (device). BF16 tensors are passed as raw 16-bit storage.
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const uint16_t* out = nullptr;
  const uint16_t* grad_out = nullptr;
  const float* lse = nullptr;
  // Element strides of batch, head and row (the last dim is contiguous).
  int64_t q_strides[3] = {0, 0, 0};
  int64_t k_strides[3] = {0, 0, 0};
  int64_t v_strides[3] = {0, 0, 0};
  int64_t out_strides[3] = {0, 0, 0};
  int64_t grad_out_strides[3] = {0, 0, 0};
  int64_t lse_strides[2] = {0, 0};  // batch, head; rows contiguous
  // Outputs (device, BF16, contiguous).
  uint16_t* dq = nullptr;
  uint16_t* dk = nullptr;
  uint16_t* dv = nullptr;

  int64_t batch = 1;
  int64_t q_heads = 1;
  int64_t kv_heads = 1;
  int64_t q_len = 1;
  int64_t kv_len = 1;
  int64_t head_dim = 64;  // 64 or 128
  float scale = 0.125f;
  CausalMode causal = CausalMode::kNone;

  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t num_segments = 0;

  Projection projection = Projection::kGproj;

  Bf16RowDiagnostics diagnostics;

  // Fills the strides of contiguous (B, H, L, d) tensors and (B, H, N) lse.
  void set_contiguous_strides();
};

Status validate(const Bf16BackwardParams& params);

// Device scratch (delta, lambda or rho/j* per row, and for gproj
// bf16(-lambda_i q_i) per row: d BF16 values), in bytes.
size_t bf16_backward_workspace_bytes(const Bf16BackwardParams& params);

// Enqueues the backward on `stream`; never synchronizes, never aborts.
Status bf16_attention_backward(const Bf16BackwardParams& params, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream);

}  // namespace gaugewatch::gpu
