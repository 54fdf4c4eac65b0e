#pragma once
// The measurement of one audit on the auditor thread: gaugewatch::attention_metrics
// and the FP32 recompute (gaugewatch::attention_backward backend "fp32") on
// the job's slices, on their device (CUDA: the side stream, one small vector
// read back through pinned memory; a shape the CUDA kernels do not take is
// measured on CPU copies instead), and the live backward's discrepancy.

#include <string>

#include "hooks/audit_job.h"

namespace gaugewatch::hooks {

// Fills job.data's metrics (catalogue order, NaN where not computed); false:
// skipped (counted with its reason: non-finite operands, memory, GPU wait).
bool measure(Job& job);

#if defined(GAUGEWATCH_HOOKS_CUDA)
// Polls an event of the side stream (never the training stream): a bounded
// wait that exit can cut short (auditor_giving_up). False: the sample is
// skipped (counted: over the limit, or `exit_reason` at exit).
bool wait_polled(const at::cuda::CUDAEvent& event, const std::string& what, const char* exit_reason);
#endif

}  // namespace gaugewatch::hooks
