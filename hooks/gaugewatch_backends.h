#pragma once
// The backends of a layer other than stock: gaugewatch::attention_backward
// (libgaugewatch_ops) run for an intercepted call, or "center" (the op's own
// backward on centred keys, center_backend.h), the gradients returned in the
// layout SDPA's own backward would give. On CUDA each fused backend is probed
// once per device before its first use.

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>

#include "hooks/gaugewatch_ops.h"
#include "hooks/sdpa_ops.h"

namespace gaugewatch::hooks {

// The layer's backend for this call, (dq, dk, dv, dbias) in the stock
// backward's layouts (dbias: center only, for a differentiable efficient
// attention bias), or nullopt (logged once: why) when it cannot run it (no
// kernel for the device, dtype not BF16, dropout or a mask for the fused
// kernels, center_keys not loaded, non-finite result): the caller then runs stock.
std::optional<std::array<at::Tensor, 4>> gaugewatch_backward(const CallInfo& info, Backend backend,
                                                             const at::Tensor& grad_out, const at::Tensor& q,
                                                             const at::Tensor& k, const at::Tensor& v,
                                                             const at::Tensor& out, const at::Tensor& lse);

}  // namespace gaugewatch::hooks
