#pragma once
// The stock SDPA ops the hooks take over (torch 2.11 schemas,
// docs/findings.md): which op a call went to, everything about the call that
// is not a differentiable tensor, and the op's own forward and backward,
// called exactly as PyTorch's derivatives.yaml does.
//   AutogradCPU   aten::_scaled_dot_product_flash_attention_for_cpu
//   AutogradCUDA  aten::_scaled_dot_product_flash_attention
//                 aten::_scaled_dot_product_cudnn_attention
//                 aten::_scaled_dot_product_efficient_attention

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <torch/custom_class.h>

#include <array>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "hooks/runtime.h"

namespace gaugewatch::hooks {

enum class OpKind { kCpuFlash, kCudaFlash, kCudnn, kEfficient };

const char* op_name(OpKind kind);

// Everything about one call that is not a differentiable tensor: the
// arguments, and the stock forward's extra outputs (undefined tensors and
// SymInts must not pass through the autograd Function: docs/findings.md).
struct CallInfo : torch::CustomClassHolder {
  OpKind kind = OpKind::kCpuFlash;
  double dropout_p = 0.0;
  bool is_causal = false;
  std::optional<double> scale;
  std::optional<at::Tensor> attn_mask;  // CPU flash
  at::Tensor attn_bias;                 // cuDNN / efficient (undefined: none)
  bool return_debug_mask = false;
  std::array<bool, 4> grad_mask{true, true, true, false};
  // Extra outputs of the stock forward.
  at::Tensor cum_seq_q, cum_seq_k, philox_seed, philox_offset, debug_attn_mask;
  c10::SymInt max_q{0}, max_k{0};
  ForwardPlan plan;

  // The call's mask or bias, whichever op it is (undefined: none).
  at::Tensor mask() const { return attn_mask.has_value() ? *attn_mask : attn_bias; }
};

// The op's forward below autograd on (q, k, v): fills `info`'s extra outputs,
// returns (out, lse). `bias`, when defined, is a differentiable efficient
// attention bias (else info.attn_bias is used).
std::tuple<at::Tensor, at::Tensor> stock_forward(CallInfo& info, const at::Tensor& q, const at::Tensor& k,
                                                 const at::Tensor& v, const at::Tensor& bias);

// The op's own backward: (dq, dk, dv, dbias) (dbias: efficient attention only).
std::array<at::Tensor, 4> stock_backward(const CallInfo& info, const at::Tensor& grad_out, const at::Tensor& q,
                                         const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                         const at::Tensor& lse);

// The dims of a gradient of `input` as SDPA's backward of `kind` lays it out
// (torch 2.11), outermost first. The CPU flash and the CUDA efficient
// backwards always allocate (B, N, H, d) and return it transposed, whatever
// the input's strides (efficient too for q, k, v sliced from one fused qkv
// buffer; measured on the H200, and its meta registration says the same):
// {0, 2, 1, 3}. The CUDA flash and cuDNN ops allocate in the input's stride
// order (torch_ops::stride_order, kernels/torch/stride_order.h, the layout
// gaugewatch::attention_backward returns), so an SDPA-strided q (transposed
// from (B, N, H, d) or sliced from a fused qkv projection) gets a
// (B, N, H, d) transposed gradient and a contiguous q a contiguous one.
std::vector<std::int64_t> stock_grad_order(const at::Tensor& input, OpKind kind);

// A gradient as SDPA's backward of `kind` returns it for `input`: the
// input's dtype, dense in stock_grad_order. `grad` is returned as it is when
// its layout already matches (the op's result for flash and cuDNN, and for
// efficient attention on SDPA-strided inputs), else copied.
at::Tensor stock_grad_layout(const at::Tensor& grad, const at::Tensor& input, OpKind kind);

// The log-sum-exp of an intercepted call as (B, H, N), a view: the ops return
// it in different layouts (torch 2.11, torch/_meta_registrations.py): the CPU
// and CUDA flash ops (B, H, N); cuDNN (B, H, N, 1); efficient attention
// (B, H, ceil(N / 32) * 32), padded. Anything else is returned unchanged
// (the caller's shape checks then refuse it).
at::Tensor canonical_lse(const at::Tensor& lse, std::int64_t q_len);

}  // namespace gaugewatch::hooks
