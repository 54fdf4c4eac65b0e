#pragma once
// The interception's two halves, shared by the eager autograd kernels
// (interceptor.cpp) and the compiled graph's custom ops (compile_ops.h):
// a call's forward plan (layer, step, backend) and its backward (the layer's
// backend, recorded, sampled calls audited).

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>

#include "hooks/sdpa_ops.h"

namespace gaugewatch::hooks {

// A call's info with the runtime's plan for its forward (the runtime counts
// the call: pass boundary, layer, backend).
c10::intrusive_ptr<CallInfo> new_call(OpKind kind, double dropout_p, bool is_causal, std::optional<double> scale,
                                      bool cuda);

// Counts a training call (one that needs a gradient) in the coverage, with
// the verdict of call_coverage.h; a recompute of checkpointing is the same
// call again and is not counted.
void count_training_call(const CallInfo& info, const at::Tensor& q, const at::Tensor& k);

// The call's backward: the layer's backend (stock when it cannot run),
// recorded, audited / captured when the runtime samples the call. Returns
// (dq, dk, dv, dbias) (dbias: efficient attention with a bias gradient).
std::array<at::Tensor, 4> intercepted_backward(const CallInfo& info, const at::Tensor& grad_out, const at::Tensor& q,
                                               const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                               const at::Tensor& lse);

}  // namespace gaugewatch::hooks
