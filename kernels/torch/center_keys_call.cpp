#include "kernels/torch/center_keys_call.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace gaugewatch::torch_ops {

namespace {

reference::CentringPolicy parse_policy(c10::string_view policy) {
  const std::string name(policy.data(), policy.size());
  try {
    return reference::parse_centring_policy(name);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK(false, "gaugewatch: center_keys: ", e.what());
  }
}

}  // namespace

void check_center_keys_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& lse,
                                std::optional<double> scale, c10::string_view policy) {
  const auto dtype = k.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kFloat,
              "gaugewatch: center_keys: k must be bfloat16, float16 or float32, got ", c10::toString(dtype));
  TORCH_CHECK(q.scalar_type() == dtype, "gaugewatch: center_keys: q must have k's dtype ", c10::toString(dtype),
              ", got ", c10::toString(q.scalar_type()));
  TORCH_CHECK(lse.scalar_type() == at::kFloat, "gaugewatch: center_keys: lse must be float32, got ",
              c10::toString(lse.scalar_type()));
  TORCH_CHECK(q.dim() == 4, "gaugewatch: center_keys: q must be 4-D (B, Hq, N, d), got ", q.dim(), "-D");
  TORCH_CHECK(k.dim() == 4, "gaugewatch: center_keys: k must be 4-D (B, Hkv, M, d), got ", k.dim(), "-D");
  TORCH_CHECK(lse.dim() == 3, "gaugewatch: center_keys: lse must be 3-D (B, Hq, L), got ", lse.dim(), "-D");
  TORCH_CHECK(k.device() == q.device() && lse.device() == q.device(),
              "gaugewatch: center_keys: q, k and lse must be on one device, got ", q.device(), ", ", k.device(),
              ", ", lse.device());
  TORCH_CHECK(!scale.has_value() || std::isfinite(*scale), "gaugewatch: center_keys: scale must be finite");
  parse_policy(policy);
}

CenterKeysCall check_center_keys(const at::Tensor& q, const at::Tensor& k, const at::Tensor& lse,
                                 std::optional<double> scale, c10::string_view policy) {
  check_center_keys_operands(q, k, lse, scale, policy);
  CenterKeysCall call;
  call.batch = q.size(0);
  call.q_heads = q.size(1);
  call.q_len = q.size(2);
  call.head_dim = q.size(3);
  call.kv_heads = k.size(1);
  call.kv_len = k.size(2);
  call.lse_len = lse.size(2);
  TORCH_CHECK(k.size(0) == call.batch && k.size(3) == call.head_dim,
              "gaugewatch: center_keys: k must be (B, Hkv, M, d) with q's B and d, got q ", q.sizes(), ", k ",
              k.sizes());
  TORCH_CHECK(call.kv_heads >= 1 && call.q_heads % call.kv_heads == 0,
              "gaugewatch: center_keys: key/value heads must divide query heads; got Hq=", call.q_heads,
              ", Hkv=", call.kv_heads);
  TORCH_CHECK(lse.size(0) == call.batch && lse.size(1) == call.q_heads && call.lse_len >= call.q_len,
              "gaugewatch: center_keys: lse must be (B, Hq, L) with L >= N = ", call.q_len, ", got ", lse.sizes());
  call.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(call.head_dim));
  call.policy = parse_policy(policy);
  return call;
}

}  // namespace gaugewatch::torch_ops
