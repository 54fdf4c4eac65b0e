// The auditor (auditor.h): slicing on the training thread, metrics and
// captures on the auditor thread.

#include "hooks/auditor.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#if defined(GAUGEWATCH_HOOKS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "audit/operands.h"
#include "hooks/cupti_timing.h"
#include "hooks/log.h"
#include "hooks/torch_errors.h"
#include "kernels/reference/metric_catalogue.h"

namespace gaugewatch::hooks {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kQueueCapacity = 4;
// A sampled step queues one job per sampled layer at once; on CUDA the thread
// drains them only as fast as the GPU reaches each layer's backward (the host
// runs ahead), so the queue takes a whole step's layers, up to this many.
constexpr std::size_t kMaxSampleQueue = 16;
// The longest the auditor waits for the GPU to reach a sampled backward (the
// host may run ahead of it by a step or more): then the sample is skipped,
// never waited for without bound (docs/hooks.md "Locks and waits").
constexpr double kGpuWaitS = 300.0;

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using MetricsFn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, const at::Tensor&, bool, std::optional<double>, c10::string_view,
                             const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                             const std::optional<at::Tensor>&);
using BackwardFn = Grads(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const at::Tensor&, bool, std::optional<double>, c10::string_view,
                         c10::string_view, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, bool,
                         bool, const std::optional<at::Tensor>&);

// A slice of one call: on the CPU for a CPU call, on the GPU (made on the
// side stream) for a CUDA call; a whole call's operands for a capture.
struct Operands {
  at::Tensor grad_out, q, k, v, out, lse;  // (S, 1, R, d) ... as in SDPA layout
};

struct Job {
  BackwardPlan plan;
  Backend ran = Backend::kStock;
  double backward_us = 0.0;
  Clock::time_point queued;
  SampleData data;  // shape filled at submit, metrics and timings by the auditor
  bool is_causal = false;
  std::string alignment = "top_left";
  std::optional<double> scale;
  bool compare_dkdv = false;
  bool sample = false;
  Operands slice;
  at::Tensor live_dq, live_dk, live_dv;
  bool capture = false;
  Operands whole;
  std::string op;
#if defined(GAUGEWATCH_HOOKS_CUDA)
  std::optional<c10::cuda::CUDAStream> side;          // the audit's stream (CUDA samples)
  std::shared_ptr<at::cuda::CUDAEvent> copied;        // side stream: slices / copies done
  std::shared_ptr<at::cuda::CUDAEvent> backward_start;  // training stream, before the backward
  std::shared_ptr<at::cuda::CUDAEvent> backward_end;    // training stream, after it
#endif
  std::shared_ptr<CudaTiming> timing;  // its CUPTI window, if any
};

class Auditor {
 public:
  Auditor() {
    thread_ = std::thread([this] {
      ::pthread_setname_np(::pthread_self(), "gw-auditor");  // named in stack dumps
      loop();
    });
  }

  bool submit(Job job) {
    std::lock_guard lock(mu_);
    // Captures were asked for by the agent: they get room beyond the samples' share.
    const std::size_t samples =
        std::min<std::size_t>(kMaxSampleQueue, std::max<std::size_t>(kQueueCapacity, job.plan.sampled_layers));
    const std::size_t capacity = job.capture ? samples + kQueueCapacity : samples;
    if (stopping_ || queue_.size() >= capacity) return false;
    queue_.push_back(std::move(job));
    cv_.notify_all();
    return true;
  }

  // Drains the queue until shortly before `timeout_s`; the jobs left then
  // are dropped (counted) and the thread ends by itself: it is joined, not
  // left running into the process's teardown (detached only if a CUDA call
  // itself does not return).
  void stop(double timeout_s) {
    std::unique_lock lock(mu_);
    stopping_ = true;
    give_up_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::max(0.0, timeout_s - 0.5)));
    cv_.notify_all();
    if (cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return exited_; })) {
      lock.unlock();
      thread_.join();
    } else {
      lock.unlock();
      log_line("exit: the auditor did not stop in time; leaving it");
      thread_.detach();
    }
  }

  // Whether waits should end now (exit: past the drain deadline).
  bool giving_up() {
    std::lock_guard lock(mu_);
    return stopping_ && Clock::now() >= give_up_at_;
  }

 private:
  void loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) break;
        job = std::move(queue_.front());
        queue_.pop_front();
        if (stopping_ && Clock::now() >= give_up_at_) {
          ++abandoned_;
          continue;
        }
      }
      try {
        run(job);
      } catch (const std::exception& e) {
        log_once(std::string("audit-error:") + job.op, std::string("audit failed (") + job.op +
                                                            "), sample skipped; logged once: " +
                                                            short_what(e));
        rt::count_audit_skipped("error");
      }
    }
    std::lock_guard lock(mu_);
    if (abandoned_ > 0) {
      log_line("exit: " + std::to_string(abandoned_) + " queued audit(s) dropped at the exit deadline");
    }
    exited_ = true;
    cv_.notify_all();
  }

  void run(Job& job);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  bool exited_ = false;
  Clock::time_point give_up_at_ = Clock::time_point::max();
  std::uint64_t abandoned_ = 0;
  std::thread thread_;
};

std::mutex g_auditor_mu;
Auditor* g_auditor = nullptr;  // leaked: lives until exit

Auditor& auditor() {
  std::lock_guard lock(g_auditor_mu);
  if (g_auditor == nullptr) {
    g_auditor = new Auditor;
    rt::add_shutdown_hook([] { stop_auditor(); });
  }
  return *g_auditor;
}

const c10::TypedOperatorHandle<MetricsFn>& metrics_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("gaugewatch::attention_metrics", "").typed<MetricsFn>();
  return op;
}

const c10::TypedOperatorHandle<BackwardFn>& backward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("gaugewatch::attention_backward", "").typed<BackwardFn>();
  return op;
}

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

std::vector<float> floats(const at::Tensor& t) {
  const at::Tensor f = t.to(at::kFloat).contiguous();
  return std::vector<float>(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
}

std::uint64_t g_capture_bytes = 0;  // auditor thread only
std::uint64_t g_capture_files = 0;

void write_capture(const Job& job) {
  const HookConfig& config = rt::config();
  const Operands& w = job.whole;
  const std::uint64_t bytes = static_cast<std::uint64_t>(
      (w.q.numel() + w.k.numel() + w.v.numel() + w.out.numel() + w.grad_out.numel()) * 2 + w.lse.numel() * 4 + 4096);
  if (g_capture_bytes + bytes > config.capture_max_bytes) {
    log_line("capture of layer " + std::to_string(job.plan.layer) + " skipped: " + std::to_string(bytes) +
             " bytes would pass GAUGEWATCH_CAPTURE_MAX_BYTES (" + std::to_string(config.capture_max_bytes) + ")");
    return;
  }
  audit::CapturedOperands c;
  auto& in = c.inputs;
  in.shape.batch = w.q.size(0);
  in.shape.q_heads = w.q.size(1);
  in.shape.kv_heads = w.k.size(1);
  in.shape.q_len = w.q.size(2);
  in.shape.kv_len = w.k.size(2);
  in.shape.head_dim = w.q.size(3);
  in.scale = job.scale.value_or(1.0 / std::sqrt(static_cast<double>(w.q.size(3))));
  in.causal = job.is_causal ? reference::CausalMode::kTopLeft : reference::CausalMode::kNone;
  in.q = floats(w.q);
  in.k = floats(w.k);
  in.v = floats(w.v);
  in.grad_out = floats(w.grad_out);
  c.saved.out = floats(w.out);
  c.saved.lse = floats(w.lse);
  std::filesystem::create_directories(config.capture_dir);
  const std::string path = config.capture_dir + "/" + config.run_id + "-rank" + std::to_string(config.rank) +
                           "-layer" + std::to_string(job.plan.layer) + "-step" + std::to_string(job.plan.step) +
                           "-" + std::to_string(g_capture_files++) + ".safetensors";
  audit::save_operands(path, c);
  g_capture_bytes += bytes;
  log_line("captured layer " + std::to_string(job.plan.layer) + " step " + std::to_string(job.plan.step) +
           " operands to " + path);
}

bool auditor_giving_up() {
  std::lock_guard lock(g_auditor_mu);
  return g_auditor != nullptr && g_auditor->giving_up();
}

}  // namespace
std::optional<double> kernel_time_us(CudaTiming& timing);
namespace {

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
  const at::Tensor values = metrics_op().call(s.grad_out, s.q, s.k, s.v, s.out, s.lse, job.is_causal, job.scale,
                                              job.alignment, std::nullopt, std::nullopt, std::nullopt);
  const auto [dq, dk, dv] = backward_op().call(s.grad_out, s.q, s.k, s.v, s.out, s.lse, job.is_causal, job.scale,
                                               "fp32", job.alignment, std::nullopt, std::nullopt, false, true,
                                               std::nullopt);
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
// Polls an event of the side stream (never the training stream): a bounded
// wait that exit can cut short (Auditor::stop). False: the sample is skipped
// (counted: over the limit, or `exit_reason` at exit).
bool wait_polled(const at::cuda::CUDAEvent& event, const std::string& what, const char* exit_reason) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kGpuWaitS));
  auto pause = std::chrono::microseconds(20);
  while (!event.query()) {
    if (Clock::now() >= deadline) {
      log_once("gpu-wait:" + what, "the GPU did not reach " + what + " within " +
                                       std::to_string(static_cast<int>(kGpuWaitS)) + " s: sample skipped (logged once)");
      rt::count_audit_skipped("GPU wait over the limit");
      return false;
    }
    if (auditor_giving_up()) {
      rt::count_audit_skipped(exit_reason);
      return false;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(1000));
  }
  return true;
}

// CUDA slices: the ops' CUDA kernels (fused BF16 with row diagnostics, the
// FP32 recompute, GProj, the metric reductions) on the side stream, after the
// sampled backward; one small vector comes back through pinned memory.
// nullopt: skipped (counted). A shape the CUDA kernels do not take (head dims
// other than 64 / 128) is measured on CPU copies instead, logged once.
std::optional<AuditNumbers> audit_on_gpu(Job& job) {
  const c10::cuda::CUDAGuard device(job.slice.q.device());
  const c10::cuda::CUDAStreamGuard on_side(*job.side);
  at::Tensor host;
  try {
    const at::Tensor all = audit_vector(job);
    host = at::empty(all.sizes(), all.options().device(at::kCPU).pinned_memory(true));
    host.copy_(all, /*non_blocking=*/true);
  } catch (const c10::OutOfMemoryError&) {
    rt::count_audit_skipped("memory budget (out of memory on the side stream)");
    return std::nullopt;
  } catch (const c10::Error& e) {
    log_once("gpu-audit:" + job.op, "the CUDA audit does not take this call (" + short_what(e) +
                                        "): its samples are measured on CPU copies of the slice (logged once)");
    for (at::Tensor* t : {&job.slice.grad_out, &job.slice.q, &job.slice.k, &job.slice.v, &job.slice.out,
                          &job.slice.lse, &job.live_dq, &job.live_dk, &job.live_dv}) {
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

void Auditor::run(Job& job) {
  double backward_us = job.backward_us;
  const char* timed_by = "host_clock";
#if defined(GAUGEWATCH_HOOKS_CUDA)
  if (job.copied) {
    if (!wait_polled(*job.copied, "a sampled backward", "exit before the GPU reached the sampled backward")) return;
    // The slices are ordered after the backward's kernels: they are done, and
    // CUPTI can deliver their records.
    std::optional<double> kernel_us;
    if (job.timing && job.sample) kernel_us = kernel_time_us(*job.timing);
    if (kernel_us) {
      backward_us = *kernel_us;
      timed_by = "cupti";
    } else if (job.backward_start && job.backward_end) {
      try {
        backward_us = 1000.0 * static_cast<double>(job.backward_start->elapsed_time(*job.backward_end));
        timed_by = "cuda_events";
      } catch (const std::exception& e) {
        // A timing that cannot be read costs the timing, not the sample.
        log_once("backward-timing", std::string("CUDA event timing of the sampled backward failed (logged once): ") +
                                        short_what(e));
        timed_by = "none";
      }
    }
  }
#endif
  // The audit's own time starts when the sampled backward is done: waiting
  // for the GPU to reach it (the training stream runs ahead of the host) is
  // queue time, not audit time charged to the budget.
  const auto start = Clock::now();
  const double queue_us = std::chrono::duration<double, std::micro>(start - job.queued).count();
  if (job.capture) write_capture(job);
  if (!job.sample) return;
  std::optional<AuditNumbers> numbers;
#if defined(GAUGEWATCH_HOOKS_CUDA)
  if (job.side && job.slice.q.is_cuda()) {
    numbers = audit_on_gpu(job);
    if (!numbers) return;
  }
#endif
  if (!numbers) numbers = audit_on_cpu(job);
  // NaN / Inf in the sampled operands (a diverging run, a bad batch): the
  // metrics would be meaningless; skip the sample, count it, carry on.
  if (!numbers->finite) {
    rt::count_audit_skipped("non-finite operands (NaN/Inf)");
    return;
  }
  SampleData& sample = job.data;
  sample.step = job.plan.step;
  sample.layer = job.plan.layer;
  sample.backend = job.ran;
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
  // live_gauge_violation (NUMERICS.md: the same backend's dQ with every key
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
  sample.backward_us = backward_us;
  rt::count_timing(timed_by);
  rt::count_audit_device(numbers->device);
  sample.audit_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  sample.queue_us = queue_us;
  sample.unix_time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  rt::submit_sample(sample);
}

// Selects the audited (batch, head) slices and query rows: slices rotate with
// the step; rows are the last max_rows (bottom-right causal alignment, which
// equals SDPA's top-left one when N == M), or the first ones when N != M.
struct Selection {
  at::Tensor q_index, kv_index;  // flat b * H + h
  std::int64_t row0 = 0, rows = 0;
  std::string alignment = "top_left";
  bool all_rows = true;
};

Selection select(const AuditCall& c, const BackwardPlan& plan) {
  const std::int64_t B = c.q.size(0), Hq = c.q.size(1), N = c.q.size(2), Hkv = c.k.size(1), M = c.k.size(2);
  const std::int64_t slices = B * Hq;
  const std::int64_t S = std::min<std::int64_t>(plan.max_heads, slices);
  const std::int64_t first = static_cast<std::int64_t>(plan.step % static_cast<std::uint64_t>(slices));
  const auto opts = at::TensorOptions().dtype(at::kLong);
  Selection sel;
  at::Tensor idx = (at::arange(S, opts) * std::max<std::int64_t>(1, slices / S) + first).remainder(slices);
  sel.q_index = idx;
  sel.kv_index = idx.div(Hq, "floor") * Hkv + idx.remainder(Hq).div(Hq / Hkv, "floor");
  sel.rows = std::min<std::int64_t>(plan.max_rows, N);
  sel.all_rows = sel.rows == N;
  if (!sel.all_rows && (N == M || !c.is_causal)) {
    sel.row0 = N - sel.rows;
    if (c.is_causal) sel.alignment = "bottom_right";
  }
  return sel;
}

// (B, H, L, d) -> the chosen slices (S, 1, L', d), contiguous. `index` is on t's device.
at::Tensor take(const at::Tensor& t, const at::Tensor& index, std::int64_t row0, std::int64_t rows) {
  const at::Tensor flat = t.reshape({t.size(0) * t.size(1), t.size(2), t.size(3)});
  at::Tensor s = flat.index_select(0, index);
  if (rows >= 0) s = s.narrow(1, row0, rows);
  return s.unsqueeze(1).contiguous();
}

at::Tensor take_lse(const at::Tensor& t, const at::Tensor& index, std::int64_t row0, std::int64_t rows) {
  const at::Tensor flat = t.reshape({t.size(0) * t.size(1), t.size(2)});
  return flat.index_select(0, index).narrow(1, row0, rows).unsqueeze(1).contiguous();
}

void fill_job(Job& job, const AuditCall& c, const BackwardPlan& plan) {
  Selection sel = select(c, plan);
  // Once to the operands' device (a CUDA call: one small copy each, not one per tensor taken).
  sel.q_index = sel.q_index.to(c.q.device());
  sel.kv_index = sel.kv_index.to(c.q.device());
  job.alignment = sel.alignment;
  job.compare_dkdv = sel.all_rows && c.q.size(1) == c.k.size(1);
  job.slice.q = take(c.q, sel.q_index, sel.row0, sel.rows);
  job.slice.grad_out = take(c.grad_out, sel.q_index, sel.row0, sel.rows);
  job.slice.out = take(c.out, sel.q_index, sel.row0, sel.rows);
  job.slice.lse = take_lse(c.lse, sel.q_index, sel.row0, sel.rows);
  job.slice.k = take(c.k, sel.kv_index, 0, -1);
  job.slice.v = take(c.v, sel.kv_index, 0, -1);
  job.live_dq = take(c.dq, sel.q_index, sel.row0, sel.rows);
  if (job.compare_dkdv) {
    job.live_dk = take(c.dk, sel.kv_index, 0, -1);
    job.live_dv = take(c.dv, sel.kv_index, 0, -1);
  }
}

void fill_shape(SampleData& s, const AuditCall& c) {
  s.batch = static_cast<std::uint32_t>(c.q.size(0));
  s.query_heads = static_cast<std::uint32_t>(c.q.size(1));
  s.key_value_heads = static_cast<std::uint32_t>(c.k.size(1));
  s.query_len = static_cast<std::uint32_t>(c.q.size(2));
  s.key_len = static_cast<std::uint32_t>(c.k.size(2));
  s.head_dim = static_cast<std::uint32_t>(c.q.size(3));
  s.is_causal = c.is_causal;
  s.dtype = c.q.scalar_type() == at::kBFloat16 ? "bfloat16" : c.q.scalar_type() == at::kHalf ? "float16" : "float32";
}

#if defined(GAUGEWATCH_HOOKS_CUDA)
at::Tensor to_pinned(const at::Tensor& t) {
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  host.copy_(t, /*non_blocking=*/true);
  return host;
}

void to_pinned(Operands& o) {
  for (at::Tensor* t : {&o.grad_out, &o.q, &o.k, &o.v, &o.out, &o.lse}) *t = to_pinned(*t);
}
#endif

}  // namespace

struct CudaTiming {
#if defined(GAUGEWATCH_HOOKS_CUDA)
  std::shared_ptr<at::cuda::CUDAEvent> start;
#endif
  std::uint64_t cupti_window = 0;  // 0: none (CUDA events time the backward)
  bool consumed = false;
  ~CudaTiming() {
    if (!consumed) cupti::discard_window(cupti_window);
  }
};

std::optional<double> kernel_time_us(CudaTiming& timing) {
  if (timing.cupti_window == 0) return std::nullopt;
  timing.consumed = true;
  const std::optional<double> us = cupti::window_kernel_us(timing.cupti_window);
  if (!us) {
    // CUPTI may have given up (no records arriving): the stats say so.
    if (const cupti::Status st = cupti::status(); !st.usable) rt::set_timing_source("cuda_events", st.detail);
  }
  return us;
}

std::shared_ptr<CudaTiming> start_backward_timing(const at::Tensor& q) {
#if defined(GAUGEWATCH_HOOKS_CUDA)
  if (!q.is_cuda()) return nullptr;
  try {
    auto timing = std::make_shared<CudaTiming>();
    // Once: CUPTI if it loads and can be subscribed, else CUDA events (stats "timing").
    static const bool reported = [] {
      const cupti::Status st = cupti::init(rt::config().timing, rt::config().cupti_lib);
      rt::set_timing_source(st.usable ? "cupti" : "cuda_events", st.detail);
      return true;
    }();
    (void)reported;
    // The events are recorded either way: a window that gets no kernel record
    // (a profiler took CUPTI meanwhile) falls back to them.
    timing->start = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    timing->start->record(c10::cuda::getCurrentCUDAStream(q.device().index()));
    timing->cupti_window = cupti::begin_window();
    // Once CUDA and CUPTI are initialized (their exit handlers registered):
    // an exit handler of ours registered after theirs runs before them, so
    // the auditor is stopped and CUPTI unsubscribed while both still work.
    static std::once_flag exit_handler;
    std::call_once(exit_handler, [] { std::atexit([] { rt::shutdown(); }); });
    return timing;
  } catch (const std::exception&) {
    return nullptr;
  }
#else
  (void)q;
  return nullptr;
#endif
}

void end_backward_timing(const std::shared_ptr<CudaTiming>& timing) {
  if (timing) cupti::end_window(timing->cupti_window);
}

at::Tensor canonical_lse(const at::Tensor& lse, std::int64_t q_len) {
  if (!lse.defined()) return lse;
  at::Tensor t = lse;
  if (t.dim() == 4 && t.size(3) == 1) t = t.select(3, 0);                 // cuDNN
  if (t.dim() == 3 && t.size(2) > q_len) t = t.narrow(2, 0, q_len);      // efficient: padding
  return t;
}

void audit_call(const AuditCall& call, const BackwardPlan& plan, Backend ran, double backward_us) {
  try {
    AuditCall c = call;
    if (c.q.dim() == 4 && !c.q.is_nested()) c.lse = canonical_lse(c.lse, c.q.size(2));
    if (c.q.dim() != 4 || c.k.dim() != 4 || !c.lse.defined() || c.lse.dim() != 3 || !c.dq.defined() ||
        c.q.is_nested() || c.lse.size(0) != c.q.size(0) || c.lse.size(1) != c.q.size(1) ||
        c.lse.size(2) != c.q.size(2)) {
      rt::count_audit_skipped("unsupported operand layout");
      return;
    }
    if (c.q.scalar_type() != at::kBFloat16 || c.k.scalar_type() != at::kBFloat16) {
      rt::count_audit_skipped("not bfloat16 (the audit measures BF16 numerics)");
      return;
    }
    if (c.q.size(1) % c.k.size(1) != 0) {
      rt::count_audit_skipped("kv heads do not divide query heads");
      return;
    }
    Job job;
    job.plan = plan;
    job.ran = ran;
    job.backward_us = backward_us;
    job.is_causal = c.is_causal;
    job.scale = c.scale;
    fill_shape(job.data, c);
    job.op = c.op;
    job.sample = plan.sample;
    job.capture = plan.capture;
    // The audit's copies (slices of q, grad_out, out, the live dq: max_rows
    // rows each; of k, v, the live dk, dv: every key) stay under
    // GAUGEWATCH_AUDIT_MAX_BYTES: a larger one skips the sample (its memory
    // budget), as an allocation failure on the side stream does.
    {
      const std::int64_t S = std::min<std::int64_t>(plan.max_heads, c.q.size(0) * c.q.size(1));
      const std::int64_t R = std::min<std::int64_t>(plan.max_rows, c.q.size(2));
      const auto slice_bytes = static_cast<std::uint64_t>(S * (4 * R + 4 * c.k.size(2)) * c.q.size(3) * 2);
      if (job.sample && slice_bytes > rt::config().audit_max_bytes) {
        rt::count_audit_skipped("memory budget (copies larger than GAUGEWATCH_AUDIT_MAX_BYTES)");
        job.sample = false;
      }
      if (!job.sample && !job.capture) return;
    }
    job.timing = c.timing;
    if (c.q.device().is_cpu()) {
      if (job.sample) fill_job(job, c, plan);
      if (job.capture) job.whole = Operands{c.grad_out.clone(), c.q.clone(), c.k.clone(), c.v.clone(),
                                            c.out.clone(), c.lse.clone()};
    } else {
#if defined(GAUGEWATCH_HOOKS_CUDA)
      const c10::cuda::CUDAGuard guard(c.q.device());
      const c10::cuda::CUDAStream training = c10::cuda::getCurrentCUDAStream(c.q.device().index());
      // One side stream per device; the backwards of several devices run on
      // their own autograd threads, hence the lock.
      static std::mutex* side_streams_mu = new std::mutex;
      static auto* side_streams = new std::map<c10::DeviceIndex, c10::cuda::CUDAStream>();
      const c10::cuda::CUDAStream side = [&] {
        std::lock_guard streams_lock(*side_streams_mu);
        auto it = side_streams->find(c.q.device().index());
        if (it == side_streams->end()) {
          it = side_streams->emplace(c.q.device().index(),
                                     c10::cuda::getStreamFromPool(/*isHighPriority=*/false, c.q.device().index()))
                   .first;
        }
        return it->second;
      }();
      auto ready = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
      ready->record(training);
      ready->block(side);
      {
        const c10::cuda::CUDAStreamGuard on_side(side);
        // Tensors made on the training stream and read here: keep their
        // memory from being reused until the side stream is done with it.
        for (const at::Tensor* t : {&c.grad_out, &c.q, &c.k, &c.v, &c.out, &c.lse, &c.dq, &c.dk, &c.dv}) {
          if (t->defined() && t->is_cuda()) t->record_stream(side);
        }
        // The slices stay on the GPU, made on (and owned by) the side stream:
        // the auditor runs the CUDA ops on them there.
        if (job.sample) {
          fill_job(job, c, plan);
          job.side = side;
        }
        if (job.capture) {
          job.whole = Operands{c.grad_out, c.q, c.k, c.v, c.out, c.lse};
          to_pinned(job.whole);
        }
        job.copied = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
        job.copied->record(side);
      }
      job.backward_end = ready;
      if (c.timing) job.backward_start = c.timing->start;
#else
      rt::count_audit_skipped("CUDA tensors in a build without CUDA");
      return;
#endif
    }
    job.queued = Clock::now();
    if (!auditor().submit(std::move(job))) rt::count_audit_skipped("auditor busy (queue full)");
  } catch (const c10::OutOfMemoryError&) {
    rt::count_audit_skipped("memory budget (out of memory on the side stream)");
  } catch (const std::exception& e) {
    log_once("audit-submit", std::string("audit setup failed, sample skipped (logged once): ") +
                                 short_what(e));
    rt::count_audit_skipped("setup error");
  }
}

void stop_auditor() {
  Auditor* a = nullptr;
  {
    std::lock_guard lock(g_auditor_mu);
    a = g_auditor;
  }
  cupti::stop(0.5);  // waits for CUPTI records end now: the samples left are timed with events
  if (a != nullptr) a->stop(3.0);
}

}  // namespace gaugewatch::hooks
