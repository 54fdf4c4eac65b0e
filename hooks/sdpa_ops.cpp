#include "hooks/sdpa_ops.h"

#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_ops.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <vector>

#include "kernels/torch/stride_order.h"

namespace gaugewatch::hooks {

using at::Tensor;

const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::kCpuFlash: return "_scaled_dot_product_flash_attention_for_cpu";
    case OpKind::kCudaFlash: return "_scaled_dot_product_flash_attention";
    case OpKind::kCudnn: return "_scaled_dot_product_cudnn_attention";
    case OpKind::kEfficient: return "_scaled_dot_product_efficient_attention";
  }
  return "?";
}

std::tuple<Tensor, Tensor> stock_forward(CallInfo& i, const Tensor& q, const Tensor& k, const Tensor& v,
                                         const Tensor& bias) {
  at::AutoDispatchBelowADInplaceOrView below;
  Tensor out, lse;
  switch (i.kind) {
    case OpKind::kCpuFlash:
      std::tie(out, lse) = at::_ops::_scaled_dot_product_flash_attention_for_cpu::call(q, k, v, i.dropout_p,
                                                                                      i.is_causal, i.attn_mask, i.scale);
      break;
    case OpKind::kCudaFlash:
      std::tie(out, lse, i.cum_seq_q, i.cum_seq_k, i.max_q, i.max_k, i.philox_seed, i.philox_offset,
               i.debug_attn_mask) = at::_ops::_scaled_dot_product_flash_attention::call(q, k, v, i.dropout_p,
                                                                                        i.is_causal,
                                                                                        i.return_debug_mask, i.scale);
      break;
    case OpKind::kCudnn:
      // An undefined Tensor converts to an optional that holds it; cuDNN
      // then rejects it as a 1-D bias: pass nullopt for "no bias".
      std::tie(out, lse, i.cum_seq_q, i.cum_seq_k, i.max_q, i.max_k, i.philox_seed, i.philox_offset,
               i.debug_attn_mask) =
          at::_ops::_scaled_dot_product_cudnn_attention::call(
              q, k, v, i.attn_bias.defined() ? std::optional<Tensor>(i.attn_bias) : std::nullopt,
              /*compute_log_sumexp=*/true, i.dropout_p, i.is_causal, i.return_debug_mask, i.scale);
      break;
    case OpKind::kEfficient: {
      const std::optional<Tensor> b = bias.defined()          ? std::optional<Tensor>(bias)
                                      : i.attn_bias.defined() ? std::optional<Tensor>(i.attn_bias)
                                                              : std::nullopt;
      std::tie(out, lse, i.philox_seed, i.philox_offset) = at::_ops::_scaled_dot_product_efficient_attention::call(
          q, k, v, b, /*compute_log_sumexp=*/true, i.dropout_p, i.is_causal, i.scale);
      if (bias.defined()) i.attn_bias = bias;
      break;
    }
  }
  return {out, lse};
}

std::array<Tensor, 4> stock_backward(const CallInfo& i, const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& lse) {
  switch (i.kind) {
    case OpKind::kCpuFlash: {
      auto [dq, dk, dv] = at::_ops::_scaled_dot_product_flash_attention_for_cpu_backward::call(
          grad_out, q, k, v, out, lse, i.dropout_p, i.is_causal, i.attn_mask, i.scale);
      return {dq, dk, dv, Tensor()};
    }
    case OpKind::kCudaFlash: {
      auto [dq, dk, dv] = at::_ops::_scaled_dot_product_flash_attention_backward::call(
          grad_out, q, k, v, out, lse, i.cum_seq_q, i.cum_seq_k, i.max_q, i.max_k, i.dropout_p, i.is_causal,
          i.philox_seed, i.philox_offset, i.scale);
      return {dq, dk, dv, Tensor()};
    }
    case OpKind::kCudnn: {
      auto [dq, dk, dv] = at::_ops::_scaled_dot_product_cudnn_attention_backward::call(
          grad_out, q, k, v, out, lse, i.philox_seed, i.philox_offset, i.attn_bias, i.cum_seq_q, i.cum_seq_k,
          i.max_q, i.max_k, i.dropout_p, i.is_causal, i.scale);
      return {dq, dk, dv, Tensor()};
    }
    case OpKind::kEfficient: {
      auto [dq, dk, dv, dbias] = at::_ops::_scaled_dot_product_efficient_attention_backward::call(
          grad_out, q, k, v, i.attn_bias, out, lse, i.philox_seed, i.philox_offset, i.dropout_p, i.grad_mask,
          i.is_causal, i.scale);
      return {dq, dk, dv, dbias};
    }
  }
  return {};
}

std::vector<std::int64_t> stock_grad_order(const Tensor& input, OpKind kind) {
  if ((kind == OpKind::kCpuFlash || kind == OpKind::kEfficient) && input.dim() == 4) return {0, 2, 1, 3};
  return torch_ops::stride_order(input);
}

Tensor stock_grad_layout(const Tensor& grad, const Tensor& input, OpKind kind) {
  return torch_ops::to_order(grad, stock_grad_order(input, kind), input.scalar_type());
}

Tensor canonical_lse(const Tensor& lse, std::int64_t q_len) {
  if (!lse.defined()) return lse;
  Tensor t = lse;
  if (t.dim() == 4 && t.size(3) == 1) t = t.select(3, 0);             // cuDNN
  if (t.dim() == 3 && t.size(2) > q_len) t = t.narrow(2, 0, q_len);  // efficient: padding
  return t;
}

}  // namespace gaugewatch::hooks
