// The auditor (auditor.h): the queue and its thread, and the hand-over of a
// sampled call on the training thread (CUDA: on a side stream).

#include "hooks/auditor.h"

#include <ATen/ATen.h>
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
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "hooks/audit_capture.h"
#include "hooks/audit_job.h"
#include "hooks/audit_measure.h"
#include "hooks/audit_slicing.h"
#include "hooks/cupti_timing.h"
#include "hooks/gaugewatch_ops.h"
#include "hooks/log.h"
#include "hooks/torch_errors.h"

namespace gaugewatch::hooks {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kQueueCapacity = 4;
// A sampled step queues one job per sampled layer at once; on CUDA the thread
// drains them only as fast as the GPU reaches each layer's backward (the host
// runs ahead), so the queue takes a whole step's layers, up to this many.
constexpr std::size_t kMaxSampleQueue = 16;

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

  // Waits until every queued audit has run (or timeout_s passed); true when
  // the queue is empty and no audit is running.
  bool wait_idle(double timeout_s) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(std::max(0.0, timeout_s)),
                        [this] { return exited_ || (queue_.empty() && !running_); });
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
          cv_.notify_all();
          continue;
        }
        running_ = true;
      }
      try {
        run(job);
      } catch (const std::exception& e) {
        log_once(std::string("audit-error:") + job.op, std::string("audit failed (") + job.op +
                                                            "), sample skipped; logged once: " +
                                                            short_what(e));
        runtime().count_audit_skipped("error");
      }
      {
        std::lock_guard lock(mu_);
        running_ = false;
      }
      cv_.notify_all();
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
  bool running_ = false;  // an audit is being run (wait_idle)
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
    runtime().add_shutdown_hook([] { stop_auditor(); });
    runtime().set_audit_drain([](double timeout_s) { return drain_auditor(timeout_s); });
  }
  return *g_auditor;
}

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
  if (!measure(job)) return;
  SampleData& sample = job.data;
  sample.step = job.plan.step;
  sample.layer = job.plan.layer;
  sample.backend = job.ran;
  sample.backward_us = backward_us;
  runtime().count_timing(timed_by);
    sample.audit_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  sample.queue_us = queue_us;
  sample.unix_time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  runtime().submit_sample(sample);
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

bool auditor_giving_up() {
  std::lock_guard lock(g_auditor_mu);
  return g_auditor != nullptr && g_auditor->giving_up();
}

void audit_call(const AuditCall& call, const BackwardPlan& plan, Backend ran, double backward_us) {
  try {
    AuditCall c = call;
    if (c.q.dim() == 4 && !c.q.is_nested()) c.lse = canonical_lse(c.lse, c.q.size(2));
    if (c.q.dim() != 4 || c.k.dim() != 4 || !c.lse.defined() || c.lse.dim() != 3 || !c.dq.defined() ||
        c.q.is_nested() || c.lse.size(0) != c.q.size(0) || c.lse.size(1) != c.q.size(1) ||
        c.lse.size(2) != c.q.size(2)) {
      runtime().count_audit_skipped("unsupported operand layout");
      return;
    }
    if (c.q.scalar_type() != at::kBFloat16 || c.k.scalar_type() != at::kBFloat16) {
      runtime().count_audit_skipped("not bfloat16 (the audit measures BF16 numerics)");
      return;
    }
    if (c.q.size(1) % c.k.size(1) != 0) {
      runtime().count_audit_skipped("kv heads do not divide query heads");
      return;
    }
    // Never a number from different math than the trainer ran: a call whose
    // operands the recompute cannot reproduce is not audited.
    if (c.dropout_p != 0.0) {
      runtime().count_audit_skipped("dropout (the audit cannot regenerate the dropout mask)");
      return;
    }
    if (c.mask.defined() && !op_takes("attention_metrics", "attn_mask")) {
      runtime().count_audit_skipped("attention mask (the loaded libgaugewatch_ops takes no attn_mask)");
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
    // The audit's copies stay under GAUGEWATCH_AUDIT_MAX_BYTES: a larger one
    // skips the sample (its memory budget), as an allocation failure on the
    // side stream does.
    if (job.sample && slice_bytes(c, plan) > runtime().config().audit_max_bytes) {
      runtime().count_audit_skipped("memory budget (copies larger than GAUGEWATCH_AUDIT_MAX_BYTES)");
      job.sample = false;
    }
    if (!job.sample && !job.capture) return;
    if (job.capture && c.mask.defined()) {
      log_once("capture-mask", "captures of masked calls hold no mask (the operand file has no field for it): "
                               "replaying them runs unmasked attention (logged once)");
    }
    job.timing = c.timing;
    if (c.q.device().is_cpu()) {
      if (job.sample) fill_job(job, c, plan);
      if (job.capture) job.whole = Operands{c.grad_out.clone(), c.q.clone(), c.k.clone(), c.v.clone(),
                                            c.out.clone(), c.lse.clone(), at::Tensor()};
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
        if (c.mask.defined() && c.mask.is_cuda()) {
          c.mask.record_stream(side);
        }
        // The slices stay on the GPU, made on (and owned by) the side stream:
        // the auditor runs the CUDA ops on them there.
        if (job.sample) {
          fill_job(job, c, plan);
          job.side = side;
        }
        if (job.capture) {
          job.whole = Operands{c.grad_out, c.q, c.k, c.v, c.out, c.lse, at::Tensor()};
          to_pinned(job.whole);
        }
        job.copied = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
        job.copied->record(side);
      }
      job.backward_end = ready;
      if (c.timing) job.backward_start = c.timing->start;
#else
      runtime().count_audit_skipped("CUDA tensors in a build without CUDA");
      return;
#endif
    }
    job.queued = Clock::now();
    if (!auditor().submit(std::move(job))) runtime().count_audit_skipped("auditor busy (queue full)");
  } catch (const c10::OutOfMemoryError&) {
    runtime().count_audit_skipped("memory budget (out of memory on the side stream)");
  } catch (const std::exception& e) {
    log_once("audit-submit", std::string("audit setup failed, sample skipped (logged once): ") +
                                 short_what(e));
    runtime().count_audit_skipped("setup error");
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

bool drain_auditor(double timeout_s) {
  Auditor* a = nullptr;
  {
    std::lock_guard lock(g_auditor_mu);
    a = g_auditor;
  }
  return a == nullptr || a->wait_idle(timeout_s);
}

}  // namespace gaugewatch::hooks
