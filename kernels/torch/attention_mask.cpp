#include "kernels/torch/attention_mask.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdint>

namespace gaugewatch::torch_ops {

void check_attn_mask_operand(const std::optional<at::Tensor>& attn_mask, const at::Tensor& q) {
  if (!attn_mask.has_value()) return;
  const at::Tensor& m = *attn_mask;
  TORCH_CHECK(m.scalar_type() == at::kBool || at::isFloatingType(m.scalar_type()),
              "gaugewatch: attn_mask must be bool (True = takes part, as SDPA) or a floating additive bias, got ",
              c10::toString(m.scalar_type()));
  TORCH_CHECK(m.dim() >= 1 && m.dim() <= 4, "gaugewatch: attn_mask must have 1 to 4 dimensions, broadcastable to ",
              "(B, Hq, N, M), got ", m.dim(), "-D");
  TORCH_CHECK(m.device() == q.device(), "gaugewatch: attn_mask is on ", m.device(), ", q on ", q.device());
}

void check_attn_mask(const std::optional<at::Tensor>& attn_mask, const AttentionCall& call, const at::Tensor& q) {
  check_attn_mask_operand(attn_mask, q);
  if (!attn_mask.has_value()) return;
  const auto& s = call.shape;
  const std::array<int64_t, 4> target{s.batch, s.q_heads, s.q_len, s.kv_len};
  const at::Tensor& m = *attn_mask;
  for (int64_t i = 0; i < m.dim(); ++i) {
    const int64_t size = m.size(m.dim() - 1 - i);
    const int64_t want = target[3 - i];
    TORCH_CHECK(size == want || size == 1, "gaugewatch: attn_mask of shape ", m.sizes(),
                " is not broadcastable to (B, Hq, N, M) = (", s.batch, ", ", s.q_heads, ", ", s.q_len, ", ", s.kv_len,
                ")");
  }
}

at::Tensor expand_attn_mask(const at::Tensor& attn_mask, const AttentionCall& call) {
  const auto& s = call.shape;
  return attn_mask.expand({s.batch, s.q_heads, s.q_len, s.kv_len});
}

}  // namespace gaugewatch::torch_ops
