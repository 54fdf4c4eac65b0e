// Meta (fake tensor) implementations of the gaugewatch ops: output shapes,
// dtypes and strides (the real kernels' own: stride_order.h), after the same
// argument checks as the real backends, so torch.compile and
// torch.library.opcheck can trace the ops.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "kernels/reference/metric_catalogue.h"
#include "kernels/torch/attention_call.h"
#include "kernels/torch/attention_mask.h"
#include "kernels/torch/center_keys_call.h"
#include "kernels/torch/registration.h"
#include "kernels/torch/stride_order.h"

namespace gaugewatch::torch_ops {
namespace {

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Grads attention_backward_meta(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool /*is_causal*/,
                              std::optional<double> /*scale*/, c10::string_view backend, c10::string_view causal_alignment,
                              const std::optional<at::Tensor>& cu_seqlens_q,
                              const std::optional<at::Tensor>& cu_seqlens_k, bool /*deterministic*/,
                              bool /*center_keys*/, const std::optional<at::Tensor>& attn_mask) {
  check_operands(grad_out, q, k, v, out, lse, causal_alignment, cu_seqlens_q, cu_seqlens_k);
  check_attn_mask_operand(attn_mask, q);
  const auto options = q.options().dtype(backend_dtype(parse_backend(backend)));
  // Every device and backend returns the gradients dense in the operands'
  // stride order (stride_order.h).
  return {empty_in_stride_order(q, options), empty_in_stride_order(k, options), empty_in_stride_order(v, options)};
}

Grads attention_backward_rows_meta(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                   const at::Tensor& slices, const at::Tensor& rows, bool /*is_causal*/,
                                   std::optional<double> /*scale*/, c10::string_view causal_alignment,
                                   const std::optional<at::Tensor>& cu_seqlens_q,
                                   const std::optional<at::Tensor>& cu_seqlens_k, bool /*deterministic*/,
                                   bool /*center_keys*/, const std::optional<at::Tensor>& attn_mask) {
  check_operands(grad_out, q, k, v, out, lse, causal_alignment, cu_seqlens_q, cu_seqlens_k);
  check_attn_mask_operand(attn_mask, q);
  check_row_subset_operands(slices, rows, q);
  const auto options = q.options().dtype(at::kFloat);
  const c10::SymInt dq_sizes[] = {slices.sym_size(0), rows.sym_size(0), q.sym_size(3)};
  return {at::empty_symint(dq_sizes, options), at::empty_symint(k.sym_sizes(), options),
          at::empty_symint(k.sym_sizes(), options)};
}

at::Tensor attention_metrics_meta(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool /*is_causal*/,
                                  std::optional<double> /*scale*/, c10::string_view causal_alignment,
                                  const std::optional<at::Tensor>& cu_seqlens_q,
                                  const std::optional<at::Tensor>& cu_seqlens_k,
                                  const std::optional<at::Tensor>& attn_mask) {
  check_operands(grad_out, q, k, v, out, lse, causal_alignment, cu_seqlens_q, cu_seqlens_k);
  check_attn_mask_operand(attn_mask, q);
  return at::empty({static_cast<int64_t>(reference::kMetricCount)}, q.options().dtype(at::kDouble));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> center_keys_meta(const at::Tensor& q, const at::Tensor& k,
                                                                const at::Tensor& lse, std::optional<double> scale,
                                                                c10::string_view policy) {
  check_center_keys_operands(q, k, lse, scale, policy);
  const c10::SymInt kbar_sizes[] = {k.sym_size(0), k.sym_size(1), k.sym_size(3)};
  return {empty_in_stride_order(k, k.options()), at::empty_symint(lse.sym_sizes(), lse.options()),
          at::empty_symint(kbar_sizes, k.options())};
}

}  // namespace

void register_meta_kernels(torch::Library& m) {
  m.impl("attention_backward", &attention_backward_meta);
  m.impl("attention_backward_rows", &attention_backward_rows_meta);
  m.impl("attention_metrics", &attention_metrics_meta);
  m.impl("center_keys", &center_keys_meta);
}

}  // namespace gaugewatch::torch_ops
