#pragma once
// Argument checks of gaugewatch::center_keys, shared by every backend (CPU,
// CUDA, Meta). Contract: kernels/torch/registration.cpp; the choice of kbar:
// kernels/reference/key_centring.h.

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>

#include "kernels/reference/key_centring.h"

namespace gaugewatch::torch_ops {

struct CenterKeysCall {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  int64_t lse_len = 0;  // L >= N
  double scale = 0.0;   // given, or 1 / sqrt(d)
  reference::CentringPolicy policy = reference::CentringPolicy::kAuto;
};

// Dtypes (q and k both bfloat16, float16 or float32; lse float32), ranks,
// devices and the policy name: safe on fake tensors with symbolic shapes.
void check_center_keys_operands(const at::Tensor& q, const at::Tensor& k, const at::Tensor& lse,
                                std::optional<double> scale, c10::string_view policy);

// The same plus every size: batch, head dim and lse's (B, Hq) agree, Hkv
// divides Hq, L >= N.
CenterKeysCall check_center_keys(const at::Tensor& q, const at::Tensor& k, const at::Tensor& lse,
                                 std::optional<double> scale, c10::string_view policy);

}  // namespace gaugewatch::torch_ops
