#pragma once
// Checks of the attn_mask keyword of the gaugewatch attention ops, shared by
// every backend (CPU, CUDA, Meta). Semantics: kernels/torch/registration.cpp.

#include <ATen/core/Tensor.h>

#include <optional>

#include "kernels/torch/attention_call.h"

namespace gaugewatch::torch_ops {

// dtype (bool or floating), rank (<= 4) and device (q's): safe on fake tensors
// with symbolic shapes, so the Meta kernels run it too.
void check_attn_mask_operand(const std::optional<at::Tensor>& attn_mask, const at::Tensor& q);

// check_attn_mask_operand, then broadcastability to (B, Hq, N, M) as SDPA
// accepts it: aligned at the trailing dimension, each size 1 or the full one.
void check_attn_mask(const std::optional<at::Tensor>& attn_mask, const AttentionCall& call, const at::Tensor& q);

// The mask as a (B, Hq, N, M) view (stride 0 along broadcast dimensions; no copy).
at::Tensor expand_attn_mask(const at::Tensor& attn_mask, const AttentionCall& call);

}  // namespace gaugewatch::torch_ops
