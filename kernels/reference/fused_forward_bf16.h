#pragma once
// Emulation of a fused BF16 attention forward (FlashAttention order): what
// the backward later reads as its saved operands.
//   S = q_i.k_j in FP32 (BF16 operands, FP32 accumulation, unscaled)
//   mx_i = max_j S_ij;  P_ij = exp2(S_ij alpha log2e - mx_i alpha log2e)
//   l_i = sum_j P_ij;   o_i = bf16( (sum_j bf16(P_ij) v_j) / l_i )
//   lse_i = mx_i alpha + log(l_i)              (FP32; +inf for empty rows)
// The max is subtracted before scaling (the repaired "SBS" form), so the
// row maximum maps to exactly exp2(0) = 1. With an attn_mask bias the scores
// are x_ij = fma(S_ij, alpha, bias_ij) and mx_i, P, lse are taken over x:
//   P_ij = exp2(x_ij log2e - mx_i log2e), lse_i = mx_i + log(l_i).
// A row whose keys are all masked out is left as a row with no key.

#include "kernels/reference/attention_problem.h"

namespace gaugewatch::reference {

SavedForward forward_fused_bf16(const AttentionInputs& in);

}  // namespace gaugewatch::reference
