#pragma once
// Backend "center" (docs/numerics.md, "Centring"): the intercepted op's own
// backward run on centred keys. gaugewatch::center_keys picks kbar per
// (batch, kv head) on the key dtype's grid and returns K - kbar and the
// log-sum-exp shifted by scale * q . kbar; softmax is invariant to a common
// key translation, so the stock backward returns the same gradient
// mathematically, with the rounded row mass multiplying a small centred key
// instead of the offset. The call's mask / bias, dropout RNG state (philox
// seed and offset of the forward) and GQA pass through unchanged.

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <string>

#include "hooks/sdpa_ops.h"

namespace gaugewatch::hooks {

// (dq, dk, dv, dbias) in the stock backward's layouts; nullopt with `why`
// set when center_keys is not available or fails (the caller runs stock).
std::optional<std::array<at::Tensor, 4>> center_backward(const CallInfo& info, const at::Tensor& grad_out,
                                                         const at::Tensor& q, const at::Tensor& k,
                                                         const at::Tensor& v, const at::Tensor& out,
                                                         const at::Tensor& lse, std::string* why);

}  // namespace gaugewatch::hooks
