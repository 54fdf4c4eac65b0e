#pragma once
// The auditor: turns one sampled (or captured) layer call into a Sample for
// the agent, off the training thread.
//
// CPU: the training thread takes small slices of the operands and of the live
// gradients (max_heads (batch, head) slices, max_rows query rows each; a
// contiguous copy, microseconds) and hands them to the auditor thread, which
// runs gaugewatch::attention_metrics and the FP32 recompute
// (gaugewatch::attention_backward backend "fp32") on them and measures the
// live backward's discrepancy. The thread's queue is bounded (4 jobs, or the
// step's sampled layers up to 16; captures get 4 more): a full
// queue skips the sample. Its run time is charged against the overhead budget
// (runtime.h), which skips later sampled steps when exceeded.
//
// CUDA: the training thread records an event on the current stream; a side
// stream waits on it, cuts the slices there (they stay on the GPU) and
// records a second event; tensors read on the side stream are
// record_stream'ed. The training stream is never synchronized. The auditor
// thread polls the side event, then launches the same two ops on the slices
// on the side stream (their CUDA kernels) and reads back one small vector
// through pinned memory; a shape the CUDA kernels do not take (head dims
// other than 64, 128, 256) is measured on CPU copies instead. Copies larger than GAUGEWATCH_AUDIT_MAX_BYTES (CPU and CUDA),
// or an allocation failure, skip the sample ("memory budget ..."); so do
// non-finite values in the sampled slices ("non-finite operands (NaN/Inf)").
//
// Capture: the whole call's operands are copied the same way and written by
// the auditor thread with audit::save_operands into GAUGEWATCH_CAPTURE_DIR,
// while the files written stay under GAUGEWATCH_CAPTURE_MAX_BYTES.
//
// Files: auditor.cpp (queue, thread, hand-over), audit_slicing.cpp (which
// slices), audit_measure.cpp (metrics and discrepancies), audit_capture.cpp,
// backward_timing.cpp (CUDA events / CUPTI).

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "hooks/backward_timing.h"
#include "hooks/runtime.h"
#include "hooks/sdpa_ops.h"

namespace gaugewatch::hooks {

// One intercepted call's operands, SDPA layout (B, H, N, d), as the backward saw them.
struct AuditCall {
  at::Tensor grad_out, q, k, v, out, lse;  // lse (B, Hq, N) float32
  at::Tensor dq, dk, dv;                   // the live gradients just computed
  bool is_causal = false;
  std::optional<double> scale;
  const char* op = "";                     // intercepted op, for the logs
  std::shared_ptr<CudaTiming> timing;      // from start_backward_timing, or nullptr
  at::Tensor mask;                         // attn_mask / attn_bias, broadcastable to (B, Hq, N, M); undefined: none
  double dropout_p = 0.0;                  // > 0: not audited (the dropout mask cannot be regenerated)
};

// Queues the audit and / or capture of `call` (plan.sample / plan.capture);
// never throws.
void audit_call(const AuditCall& call, const BackwardPlan& plan, Backend ran, double backward_us);

// Waits until every audit queued so far has run and submitted its sample
// (or timeout_s passed; false then). Registered as the runtime's audit drain
// (flush()): without it, a trainer that flushes finds samples still being
// measured.
bool drain_auditor(double timeout_s);

// Drains the queue (bounded), stops the thread: at exit.
void stop_auditor();

}  // namespace gaugewatch::hooks
