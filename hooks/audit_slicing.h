#pragma once
// The audited part of a call, cut on the training thread (or the CUDA side
// stream): max_heads (batch, head) slices rotating with the step, max_rows
// query rows each (the last ones, bottom-right causal alignment, which equals
// SDPA's top-left one when N == M; the first ones when N != M), every key.

#include "hooks/audit_job.h"
#include "hooks/auditor.h"

namespace gaugewatch::hooks {

// The slices of `call` into job.slice / job.live_*, and job.alignment /
// job.compare_dkdv (dk, dv compared only when every row is taken, no GQA).
void fill_job(Job& job, const AuditCall& call, const BackwardPlan& plan);
// The sample's shape fields from the whole call.
void fill_shape(SampleData& sample, const AuditCall& call);
// Bytes the slices of `call` take (checked against GAUGEWATCH_AUDIT_MAX_BYTES).
std::uint64_t slice_bytes(const AuditCall& call, const BackwardPlan& plan);

}  // namespace gaugewatch::hooks
