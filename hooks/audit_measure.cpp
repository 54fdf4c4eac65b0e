#include "hooks/audit_measure.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#if defined(GAUGEWATCH_HOOKS_CUDA)
#include <c10/cuda/CUDAGuard.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hooks/gaugewatch_ops.h"
#include "hooks/log.h"
#include "hooks/torch_errors.h"
#include "kernels/reference/metric_catalogue.h"

namespace gaugewatch::hooks {
namespace {

using Clock = std::chrono::steady_clock;
// The longest the auditor waits for the GPU to reach a sampled backward (the
// host may run ahead of it by a step or more): then the sample is skipped,
// never waited for without bound (docs/hooks.md "Locks and waits").
constexpr double kGpuWaitS = 300.0;

// (||live - ref||, ||ref||) in double, on the tensors' device: the GPU audit
// reads every such pair back in one copy.
at::Tensor error_terms(const at::Tensor& live, const at::Tensor& ref) {
  const at::Tensor r = ref.to(at::kDouble);
  return at::stack({(live.to(at::kDouble) - r).norm(), r.norm()});
}

double relative_error(double num, double denom) {
  if (!(denom > 0.0)) return num == 0.0 ? 0.0 : std::nan("");
  return num / denom;
}

// What one audit measures: the metrics op's values, the live gradients'
// error terms against the FP32 recompute, and whether the slice was finite.
struct AuditNumbers {
  bool finite = true;
  const char* device = "cpu";       // where the metrics were computed
  std::vector<double> metrics;      // attention_metrics, catalogue order
  double dq[2] = {0.0, 0.0};        // error_terms(live dq, fp32 dq)
  double dk[2] = {0.0, 0.0}, dv[2] = {0.0, 0.0};  // when compare_dkdv
};

at::Tensor finite_flag(const Operands& o) {
  std::vector<at::Tensor> flags;
  for (const at::Tensor* t : {&o.grad_out, &o.q, &o.k, &o.v, &o.out, &o.lse}) {
    if (t->defined()) flags.push_back(at::isfinite(*t).all());
  }
  return at::stack(flags).all();
}

// The metrics op and the FP32 recompute on the slice, on the slice's device
// (the caller's current stream), gathered into one float64 vector:
// [finite, metrics..., dq terms, (dk terms, dv terms)].
at::Tensor audit_vector(const Job& job) {
  const Operands& s = job.slice;
  // Passed only when the call had one (an older libgaugewatch_ops takes no attn_mask).
  const c10::IValue mask = s.mask.defined() ? c10::IValue(s.mask) : c10::IValue();
  const at::Tensor values =
      call_op("attention_metrics", {{"grad_out", s.grad_out}, {"q", s.q}, {"k", s.k}, {"v", s.v}, {"out", s.out},
                                    {"lse", s.lse}, {"is_causal", job.is_causal}, {"scale", job.scale},
                                    {"causal_alignment", job.alignment}, {"attn_mask", mask}})
          .toTensor();
  const auto [dq, dk, dv] =
      grads_of(call_op("attention_backward", {{"grad_out", s.grad_out}, {"q", s.q}, {"k", s.k}, {"v", s.v},
                                              {"out", s.out}, {"lse", s.lse}, {"is_causal", job.is_causal},
                                              {"scale", job.scale}, {"backend", std::string("fp32")},
                                              {"causal_alignment", job.alignment}, {"attn_mask", mask}}));
  std::vector<at::Tensor> parts{finite_flag(s).to(at::kDouble).reshape({1}), values.to(at::kDouble).reshape({-1}),
                                error_terms(job.live_dq, dq)};
  if (job.compare_dkdv) {
    parts.push_back(error_terms(job.live_dk, dk));
    parts.push_back(error_terms(job.live_dv, dv));
  }
  return at::cat(parts);
}

AuditNumbers parse_audit_vector(const at::Tensor& host, bool compare_dkdv) {
  const at::Tensor v = host.to(at::kDouble).contiguous();
  const double* p = v.data_ptr<double>();
  const std::int64_t n = v.numel(), tail = compare_dkdv ? 6 : 2;
  AuditNumbers out;
  out.finite = p[0] != 0.0;
  out.metrics.assign(p + 1, p + (n - tail));
  out.dq[0] = p[n - tail];
  out.dq[1] = p[n - tail + 1];
  if (compare_dkdv) {
    out.dk[0] = p[n - 4];
    out.dk[1] = p[n - 3];
    out.dv[0] = p[n - 2];
    out.dv[1] = p[n - 1];
  }
  return out;
}

// CPU slices: the ops' CPU implementations (the reference). A non-finite
// slice is found first and costs no metrics.
AuditNumbers audit_on_cpu(const Job& job) {
  if (!finite_flag(job.slice).item<bool>()) return AuditNumbers{false, "cpu", {}, {}, {}, {}};
  return parse_audit_vector(audit_vector(job), job.compare_dkdv);
}

#if defined(GAUGEWATCH_HOOKS_CUDA)
}  // namespace

bool wait_polled(const at::cuda::CUDAEvent& event, const std::string& what, const char* exit_reason) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kGpuWaitS));
  auto pause = std::chrono::microseconds(20);
  while (!event.query()) {
    if (Clock::now() >= deadline) {
      log_once("gpu-wait:" + what, "the GPU did not reach " + what + " within " +
                                       std::to_string(static_cast<int>(kGpuWaitS)) + " s: sample skipped (logged once)");
      runtime().count_audit_skipped("GPU wait over the limit");
      return false;
    }
    if (auditor_giving_up()) {
      runtime().count_audit_skipped(exit_reason);
      return false;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(1000));
  }
  return true;
}

namespace {

// CUDA slices: the ops' CUDA kernels (fused BF16 with row diagnostics, the
// FP32 recompute, GProj, the metric reductions) on the side stream, after the
// sampled backward; one small vector comes back through pinned memory.
// nullopt: skipped (counted). A shape the CUDA kernels do not take (head dims
// other than 64, 128, 256) is measured on CPU copies instead, logged once.
std::optional<AuditNumbers> audit_on_gpu(Job& job) {
  const c10::cuda::CUDAGuard device(job.slice.q.device());
  const c10::cuda::CUDAStreamGuard on_side(*job.side);
  at::Tensor host;
  try {
    const at::Tensor all = audit_vector(job);
    host = at::empty(all.sizes(), all.options().device(at::kCPU).pinned_memory(true));
    host.copy_(all, /*non_blocking=*/true);
  } catch (const c10::OutOfMemoryError&) {
    runtime().count_audit_skipped("memory budget (out of memory on the side stream)");
    return std::nullopt;
  } catch (const c10::Error& e) {
    log_once("gpu-audit:" + job.op, "the CUDA audit does not take this call (" + short_what(e) +
                                        "): its samples are measured on CPU copies of the slice (logged once)");
    for (at::Tensor* t : {&job.slice.grad_out, &job.slice.q, &job.slice.k, &job.slice.v, &job.slice.out,
                          &job.slice.lse, &job.slice.mask, &job.live_dq, &job.live_dk, &job.live_dv}) {
      if (t->defined()) *t = t->to(at::kCPU);
    }
    return audit_on_cpu(job);
  }
  at::cuda::CUDAEvent done(cudaEventDefault);
  done.record(*job.side);
  if (!wait_polled(done, "the end of the audit's kernels", "exit before the audit's kernels ended")) return std::nullopt;
  AuditNumbers numbers = parse_audit_vector(host, job.compare_dkdv);
  numbers.device = "cuda";
  return numbers;
}
#endif

}  // namespace

bool measure(Job& job) {
  std::optional<AuditNumbers> numbers;
#if defined(GAUGEWATCH_HOOKS_CUDA)
  if (job.side && job.slice.q.is_cuda()) {
    numbers = audit_on_gpu(job);
    if (!numbers) return false;
  }
#endif
  if (!numbers) numbers = audit_on_cpu(job);
  // NaN / Inf in the sampled operands (a diverging run, a bad batch): the
  // metrics would be meaningless; skip the sample, count it, carry on.
  if (!numbers->finite) {
    runtime().count_audit_skipped("non-finite operands (NaN/Inf)");
    return false;
  }
  SampleData& sample = job.data;
  sample.metrics.fill(std::nan(""));
  const std::vector<double>& values = numbers->metrics;
  const auto& catalogue = reference::metric_catalogue();
  for (std::size_t i = 0; i < catalogue.size() && i < values.size(); ++i) {
    const auto id = catalogue[i].id;
    // "live" metrics describe the backward that actually ran: measured below
    // from its gradients, not taken from the reference's BF16 emulation.
    if (id == reference::MetricId::kLiveDqDiscrepancy || id == reference::MetricId::kLiveDkDiscrepancy ||
        id == reference::MetricId::kLiveDvDiscrepancy || id == reference::MetricId::kLiveGaugeViolation) {
      continue;
    }
    sample.metrics[i] = values[i];
  }
  auto slot = [&](reference::MetricId id) -> double& { return sample.metrics[static_cast<std::size_t>(id)]; };
  // live_gauge_violation (docs/numerics.md: the same backend's dQ with every key
  // translated by minus the mean key): the op measures it on this slice for
  // the stock fused BF16 numerics ("live" in the op) and for GProj; report
  // the one of the backend that ran. The op has none for pivot or fp32.
  auto op_value = [&](reference::MetricId id) {
    const auto i = static_cast<std::size_t>(id);
    return i < values.size() ? values[i] : std::nan("");
  };
  if (job.ran == Backend::kStock || job.ran == Backend::kBf16) {
    slot(reference::MetricId::kLiveGaugeViolation) = op_value(reference::MetricId::kLiveGaugeViolation);
  } else if (job.ran == Backend::kGproj) {
    slot(reference::MetricId::kLiveGaugeViolation) = op_value(reference::MetricId::kGprojGaugeViolation);
  }
  slot(reference::MetricId::kLiveDqDiscrepancy) = relative_error(numbers->dq[0], numbers->dq[1]);
  if (job.compare_dkdv) {
    slot(reference::MetricId::kLiveDkDiscrepancy) = relative_error(numbers->dk[0], numbers->dk[1]);
    slot(reference::MetricId::kLiveDvDiscrepancy) = relative_error(numbers->dv[0], numbers->dv[1]);
  }
  runtime().count_audit_device(numbers->device);
  return true;
}

}  // namespace gaugewatch::hooks
