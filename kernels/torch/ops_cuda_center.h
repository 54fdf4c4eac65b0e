#pragma once
// Backend "center" and the center_keys op on CUDA (ops_cuda_center.cpp);
// semantics: kernels/torch/registration.cpp.

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "kernels/torch/attention_call.h"

namespace gaugewatch::torch_ops {

// The stock SDPA backward of the device on center_keys' outputs (policy
// "auto"): the flash backward (GQA natively), or the memory-efficient one
// where flash cannot take the call (attn_mask; top-left causal with N != M;
// GQA through repeated kv heads whose gradients are summed per group). BF16
// gradients.
std::tuple<at::Tensor, at::Tensor, at::Tensor> center_backward_cuda(
    const AttentionCall& call, const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& attn_mask);

// m.impl of center_keys; called from register_cuda_kernels.
void register_cuda_center(torch::Library& m);

}  // namespace gaugewatch::torch_ops
