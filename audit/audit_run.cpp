#include "audit/audit_run.h"

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "audit/safetensors.h"
#include "kernels/reference/errors.h"
#include "kernels/reference/fp32_backward.h"
#include "kernels/reference/key_centring.h"

namespace gaugewatch::audit {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int64_t largest_mean_key_coordinate(const reference::AttentionInputs& in) {
  const int64_t d = in.shape.head_dim;
  std::vector<double> mean(d, 0.0);
  for (size_t i = 0; i < in.k.size(); ++i) mean[i % d] += in.k[i];
  int64_t best = 0;
  for (int64_t c = 1; c < d; ++c) {
    if (std::abs(mean[c]) > std::abs(mean[best])) best = c;
  }
  return best;
}

template <typename T>
BackendResult compare(std::string name, const std::vector<T>& dq, const std::vector<T>& dk,
                      const std::vector<T>& dv, const reference::ExactAttention& exact,
                      const reference::AttentionInputs& in, int64_t coordinate) {
  BackendResult r;
  r.name = std::move(name);
  r.dq_error = reference::relative_error(dq, exact.dq);
  r.dk_error = reference::relative_error(dk, exact.dk);
  r.dv_error = reference::relative_error(dv, exact.dv);
  const int64_t d = in.shape.head_dim;
  bool first = true;
  for (int64_t row = 0; row < in.shape.q_rows(); ++row) {
    if (!std::isfinite(exact.lse[row])) continue;  // row sees no key
    const double value = static_cast<double>(dq[row * d + coordinate]);
    if (first) {
      r.offset_coordinate_first_row = value;
      first = false;
    }
    r.offset_coordinate_max_error =
        std::max(r.offset_coordinate_max_error, std::abs(value - exact.dq[row * d + coordinate]));
  }
  return r;
}

}  // namespace

const BackendResult& AuditReport::backend(const std::string& name) const {
  for (const auto& b : backends) {
    if (b.name == name) return b;
  }
  throw std::out_of_range("no backend '" + name + "' in the audit report");
}

AuditOutcome run_audit(const std::string& source, const CapturedOperands& operands) {
  const reference::AttentionInputs& in = operands.inputs;
  in.validate();
  AuditOutcome outcome;
  AuditReport& report = outcome.report;
  report.source = source;
  report.shape = in.shape;
  report.causal = in.causal;
  report.scale = in.scale;
  report.segments = in.packed() ? static_cast<int64_t>(in.cu_seqlens_q.size()) - 1 : 0;
  report.offset_coordinate = largest_mean_key_coordinate(in);

  auto start = Clock::now();
  outcome.exact = reference::attention_fp64(in);
  const double fp64_seconds = seconds_since(start);
  report.exact_max_relative_row_sum = outcome.exact.max_relative_row_sum;

  start = Clock::now();
  outcome.fp32 = reference::backward_fp32(in);
  const double fp32_seconds = seconds_since(start);

  start = Clock::now();
  outcome.fused = reference::backward_fused_bf16(in, operands.saved);
  const double fused_seconds = seconds_since(start);

  start = Clock::now();
  outcome.center = reference::backward_center_bf16(in, operands.saved);
  const double center_seconds = seconds_since(start);

  const int64_t c = report.offset_coordinate;
  const auto& ex = outcome.exact;
  report.backends.push_back(compare("fp64", ex.dq, ex.dk, ex.dv, ex, in, c));
  report.backends.push_back(compare("fp32", outcome.fp32.dq, outcome.fp32.dk, outcome.fp32.dv, ex, in, c));
  const auto& f = outcome.fused;
  report.backends.push_back(compare("bf16", f.plain.dq, f.plain.dk, f.plain.dv, ex, in, c));
  report.backends.push_back(compare("gproj", f.gproj.dq, f.gproj.dk, f.gproj.dv, ex, in, c));
  report.backends.push_back(compare("pivot", f.pivot.dq, f.pivot.dk, f.pivot.dv, ex, in, c));
  const auto& ce = outcome.center;
  report.backends.push_back(compare("center", ce.dq, ce.dk, ce.dv, ex, in, c));
  report.backends[0].seconds = fp64_seconds;
  report.backends[1].seconds = fp32_seconds;
  // The three fused variants come from one sweep over the same operands.
  for (size_t i = 2; i < 5; ++i) report.backends[i].seconds = fused_seconds;
  report.backends[5].seconds = center_seconds;

  start = Clock::now();
  report.metrics = reference::compute_metrics(in, operands.saved, outcome.fused, outcome.fp32);
  report.metrics_seconds = seconds_since(start);
  return outcome;
}

void write_gradients(const std::string& path, const AuditOutcome& outcome) {
  const auto& s = outcome.report.shape;
  const std::vector<int64_t> q_shape{s.batch, s.q_heads, s.q_len, s.head_dim};
  const std::vector<int64_t> kv_shape{s.batch, s.kv_heads, s.kv_len, s.head_dim};
  SafetensorsFile file;
  file.tensors["fp64.dq"] = make_f64_tensor(outcome.exact.dq, q_shape);
  file.tensors["fp64.dk"] = make_f64_tensor(outcome.exact.dk, kv_shape);
  file.tensors["fp64.dv"] = make_f64_tensor(outcome.exact.dv, kv_shape);
  file.tensors["fp64.out"] = make_f64_tensor(outcome.exact.out, q_shape);
  file.tensors["fp64.lse"] = make_f64_tensor(outcome.exact.lse, {s.batch, s.q_heads, s.q_len});
  auto put = [&](const std::string& name, const reference::Gradients& g) {
    file.tensors[name + ".dq"] = make_f32_tensor(g.dq, q_shape);
    file.tensors[name + ".dk"] = make_f32_tensor(g.dk, kv_shape);
    file.tensors[name + ".dv"] = make_f32_tensor(g.dv, kv_shape);
  };
  put("fp32", outcome.fp32);
  put("bf16", outcome.fused.plain);
  put("gproj", outcome.fused.gproj);
  put("pivot", outcome.fused.pivot);
  put("center", outcome.center);
  file.tensors["rows.row_mass"] = make_f32_tensor(outcome.fused.rows.row_mass, {s.batch, s.q_heads, s.q_len});
  file.metadata["source"] = outcome.report.source;
  write_safetensors(path, file);
}

}  // namespace gaugewatch::audit
