#pragma once
// One audit: every backend of the reference on the same captured operands,
// their errors against FP64, and the docs/numerics.md metrics.

#include <optional>
#include <string>
#include <vector>

#include "audit/operands.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/metrics.h"

namespace gaugewatch::audit {

struct BackendResult {
  std::string name;  // fp64, fp32, bf16, gproj, pivot, center
  double dq_error = 0.0;  // ||dX - dX_fp64|| / ||dX_fp64||
  double dk_error = 0.0;
  double dv_error = 0.0;
  // dQ in the coordinate a common key offset leaks into (the largest
  // coordinate of the mean key): the largest error over rows, and the value
  // in the first row that sees a key.
  double offset_coordinate_max_error = 0.0;
  double offset_coordinate_first_row = 0.0;
  double seconds = 0.0;  // CPU time of this backend's reference
};

struct AuditReport {
  std::string source;  // scenario name or file path
  reference::AttentionShape shape;
  reference::CausalMode causal = reference::CausalMode::kNone;
  double scale = 0.0;
  int64_t segments = 0;  // packed segments, 0 when dense
  int64_t offset_coordinate = 0;
  double exact_max_relative_row_sum = 0.0;  // conservation law in FP64
  std::vector<BackendResult> backends;
  reference::AttentionMetrics metrics;
  double metrics_seconds = 0.0;

  const BackendResult& backend(const std::string& name) const;
};

// Everything an audit computed, for --dump-gradients and tests.
struct AuditOutcome {
  AuditReport report;
  reference::ExactAttention exact;
  reference::Gradients fp32;
  reference::FusedBackward fused;
  reference::Gradients center;  // the plain fused backward on centred keys
};

AuditOutcome run_audit(const std::string& source, const CapturedOperands& operands);

// Writes fp64.{dq,dk,dv} (F64), and {fp32,bf16,gproj,pivot,center}.{dq,dk,dv} (F32,
// BF16 values) in SDPA layout to a safetensors file.
void write_gradients(const std::string& path, const AuditOutcome& outcome);

}  // namespace gaugewatch::audit
