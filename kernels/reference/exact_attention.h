#pragma once
// FP64 attention, forward and backward: the ground truth every backend is
// measured against. Inputs are the BF16-valued operands; every product and
// sum is in double, the softmax is recomputed from q and k (the saved BF16
// output and FP32 lse of a fused forward are not used), so
//   s_ij = alpha q_i.k_j + bias_ij (attn_mask),  p_ij = softmax_j(s_ij),  o_i = sum_j p_ij v_j,
//   delta_i = sum_j p_ij a_ij  (a_ij = u_i.v_j),  g_ij = p_ij (a_ij - delta_i),
//   dq_i = alpha sum_j g_ij k_j,  dk_j = alpha sum_i g_ij q_i,  dv_j = sum_i p_ij u_i.
// Rows with no visible key (or every visible key masked) give o = 0,
// lse = +inf and zero gradients.

#include <vector>

#include "kernels/reference/attention_problem.h"

namespace gaugewatch::reference {

struct ExactAttention {
  std::vector<double> out;  // (B, Hq, N, d)
  std::vector<double> lse;  // (B, Hq, N)
  std::vector<double> dq;   // (B, Hq, N, d)
  std::vector<double> dk;   // (B, Hkv, M, d)
  std::vector<double> dv;   // (B, Hkv, M, d)
  // Largest |sum_j g_ij| over rows, relative to sum_j p_ij |a_ij| (the size of
  // the terms that cancel): the conservation law holds to FP64 rounding
  // (~1e-16) in the exact gradient.
  double max_relative_row_sum = 0.0;
};

ExactAttention attention_fp64(const AttentionInputs& in);

}  // namespace gaugewatch::reference
