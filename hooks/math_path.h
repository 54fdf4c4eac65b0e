#pragma once
// SDPA's math fallback (aten::_scaled_dot_product_attention_math: dropout on
// the CPU, or inputs no fused kernel takes) never reaches the fused ops the
// interceptor takes over: it is taken at the Autograd keys too, only to count
// the call as not monitored (coverage.h, reason "dropout" or "math_path"),
// and passed on unchanged to its composite implementation (autograd then
// records the ops it is made of, as without the hooks).

#include <torch/library.h>

namespace gaugewatch::hooks {

void register_math_path(torch::Library& autograd_cpu, torch::Library& autograd_cuda);

}  // namespace gaugewatch::hooks
