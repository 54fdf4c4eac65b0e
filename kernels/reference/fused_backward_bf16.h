#pragma once
// Emulation of a fused BF16 attention backward, faithful to the operand
// order of FlashAttention 2/3, cuDNN and PyTorch's efficient kernel, and the
// two projections that repair it (docs/numerics.md), all on the same operands.
//
// Per query row i and visible key j, in FP32:
//   S_ij    = q_i.k_j                                   (unscaled)
//   P_ij    = exp2(S_ij alpha log2e - lse_i log2e)      from the saved lse
//             (with an attn_mask: exp2(S_ij alpha log2e + (bias_ij log2e - lse_i log2e)))
//   delta_i = sum_c dO_ic O_ic                          from the saved BF16 out
//   dP_ij   = dO_i.v_j
//   t_ij    = bf16(P_ij (dP_ij - delta_i))              the operand "dS"
//   r_ij    = bf16(P_ij)
// and FP32-accumulated contractions, final results rounded to BF16:
//   plain:  dV_j = sum_i r_ij dO_i;  dQ_i = alpha sum_j t_ij k_j;
//           dK_j = alpha sum_i t_ij q_i
//   gproj:  rho_i = sum_j t_ij, m_i = sum_j r_ij, lambda_i = rho_i / m_i
//           dQ'_i = alpha (sum_j t_ij k_j - lambda_i sum_j r_ij k_j)
//           dK'_j = alpha (sum_i t_ij q_i - sum_i r_ij lambda_i q_i)
//   pivot:  j*(i) = argmax_j P_ij (ties to the lower j)
//           dQ'_i = alpha (sum_j t_ij k_j - rho_i k_j*)
//           dK'_j = alpha (sum_i t_ij q_i - sum_{i: j*(i)=j} rho_i q_i)
// dV is the same for all three. Rows with no visible key, or whose visible keys
// are all masked out, contribute nothing (lambda = 0, j* = -1).

#include <cstdint>
#include <vector>

#include "kernels/reference/attention_problem.h"

namespace gaugewatch::reference {

struct Gradients {
  std::vector<float> dq;  // (B, Hq, N, d)
  std::vector<float> dk;  // (B, Hkv, M, d)
  std::vector<float> dv;  // (B, Hkv, M, d)
};

// What the kernel knows about each query row after seeing all its keys.
struct RowDiagnostics {
  std::vector<float> row_mass;       // rho_i = sum_j t_ij (FP32 sum of BF16 values)
  std::vector<float> prob_mass;      // m_i = sum_j r_ij
  std::vector<float> abs_row_mass;   // sum_j |t_ij|
  std::vector<float> p_max;          // max_j P_ij (FP32)
  std::vector<int64_t> pivot;        // j*(i) along M, -1 for rows with no key
  std::vector<float> logit_abs_max;  // max_j |alpha S_ij|
};

struct FusedBackward {
  Gradients plain;  // the stock fused kernels' result ("bf16")
  Gradients gproj;
  Gradients pivot;
  RowDiagnostics rows;  // (B, Hq, N)
};

// Where delta_i = u_i.o_i comes from.
enum class DeltaSource {
  // rowsum(dO * O) over the saved BF16 output: FlashAttention, cuDNN and the
  // efficient kernel. The output's rounding then adds row mass of its own
  // (the "second channel" of docs/numerics.md).
  kSavedOutput,
  // sum_j P_ij dP_ij in FP32: isolates the BF16 rounding of dS.
  kProbabilities,
};

struct FusedBackwardOptions {
  // Round the final dQ, dK, dV to BF16 as a BF16 kernel's outputs are.
  bool round_outputs = true;
  DeltaSource delta_source = DeltaSource::kSavedOutput;
};

FusedBackward backward_fused_bf16(const AttentionInputs& in, const SavedForward& saved,
                                  const FusedBackwardOptions& options = {});

}  // namespace gaugewatch::reference
