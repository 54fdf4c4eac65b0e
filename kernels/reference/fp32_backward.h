#pragma once
// FP32 attention backward: FP32 operands and arithmetic throughout, no
// rounding of intermediates. This is what the monitor recomputes on sampled
// layers and reports every discrepancy against.
//
// It recomputes its own softmax (row max, sum, lse in FP32) and delta_i =
// sum_j P_ij dP_ij, so neither the saved BF16 output nor the saved lse enters:
// both would bring the forward's rounding into delta and break the zero row
// sum that the comparison is about.
//
// With center_keys, every key/value head's mean key mu (over all M keys) is
// subtracted first. The exact gradients are invariant to that translation
// (docs/numerics.md, gauge invariance), and FP32 logits of sink-like inputs
// (|s| up to ~3e4) otherwise limit the result to ~|s| 2^-24 absolute error
// in P: centering removes most of that floor.

#include "kernels/reference/attention_problem.h"
#include "kernels/reference/fused_backward_bf16.h"

namespace gaugewatch::reference {

struct Fp32BackwardOptions {
  bool center_keys = true;
};

Gradients backward_fp32(const AttentionInputs& in, const Fp32BackwardOptions& options = {});

}  // namespace gaugewatch::reference
