#include "hooks/math_path.h"

#include <ATen/core/grad_mode.h>
#include <ATen/ops/_scaled_dot_product_attention_math_ops.h>
#include <c10/core/DispatchKeySet.h>

#include <optional>
#include <string>
#include <tuple>

#include "hooks/call_coverage.h"
#include "hooks/log.h"
#include "hooks/runtime.h"
#include "hooks/torch_errors.h"

namespace gaugewatch::hooks {
namespace {

using at::Tensor;

std::tuple<Tensor, Tensor> math_path(c10::DispatchKeySet keys, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const std::optional<Tensor>& attn_mask, double dropout_p, bool is_causal,
                                     const std::optional<Tensor>& dropout_mask, std::optional<double> scale,
                                     bool enable_gqa) {
  // Training calls only (as for the fused ops), and not the fake tensors of a
  // torch.compile trace (a trace is not a call).
  const bool training = at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (training && !q.key_set().has(c10::DispatchKey::Python)) {
    try {
      runtime().count_call(-1, classify_math_path(dropout_p));
    } catch (const std::exception& e) {
      log_once("math-path-count", std::string("counting a math-path call failed (logged once): ") + short_what(e));
    }
  }
  // The backend key's kernel is the composite implementation: its ops are
  // dispatched from the top again, so autograd records them.
  return at::_ops::_scaled_dot_product_attention_math::redispatch(keys & c10::after_autograd_keyset, q, k, v,
                                                                  attn_mask, dropout_p, is_causal, dropout_mask,
                                                                  scale, enable_gqa);
}

}  // namespace

void register_math_path(torch::Library& autograd_cpu, torch::Library& autograd_cuda) {
  autograd_cpu.impl("_scaled_dot_product_attention_math", TORCH_FN(math_path));
  autograd_cuda.impl("_scaled_dot_product_attention_math", TORCH_FN(math_path));
}

}  // namespace gaugewatch::hooks
