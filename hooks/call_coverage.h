#pragma once
// What the hooks can do with one intercepted training call (coverage.h):
// whether the audit measures it faithfully, and if not why, and which
// correcting backends take it. Decided at the forward from the call's
// arguments (no device synchronization).

#include <ATen/core/Tensor.h>

#include "hooks/agent_messages.h"
#include "hooks/sdpa_ops.h"

namespace gaugewatch::hooks {

CallVerdict classify(const CallInfo& info, const at::Tensor& q, const at::Tensor& k);

// A call of SDPA's math fallback (no fused op: not monitored, no layer).
CallVerdict classify_math_path(double dropout_p);

}  // namespace gaugewatch::hooks
