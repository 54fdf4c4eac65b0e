// The runtime (runtime.h): layers, the pass / step boundary, the sampler,
// counters fed by the interceptor and the auditor.
#include "hooks/runtime.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "hooks/log.h"

#ifndef GAUGEWATCH_HOOKS_VERSION
#define GAUGEWATCH_HOOKS_VERSION "0.0.0"
#endif

namespace gaugewatch::hooks {

using Clock = std::chrono::steady_clock;

Runtime::Runtime(HookConfig config)
    : config_(std::move(config)),
      every_n_steps_(config_.every_n_steps),
      layer_fraction_(config_.layer_fraction),
      max_heads_(config_.max_heads),
      max_rows_(config_.max_rows),
      overhead_budget_(config_.overhead_budget) {}

Runtime::~Runtime() = default;

std::int64_t Runtime::layer_for_name_locked(const std::string& name) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  const auto id = static_cast<std::int64_t>(layers_.size());
  LayerRecord layer;
  layer.name = name;
  layer.backend = config_.backend;
  for (const auto& [index, backend] : config_.layer_backends) {
    if (index == static_cast<std::uint32_t>(id)) layer.backend = backend;
  }
  layer.last_ran = layer.backend;
  layers_.push_back(std::move(layer));
  by_name_.emplace(name, id);
  ++version_;
  if (frozen_) {
    log_line("new layer " + std::to_string(id) + " '" + name + "' after the first step: the agent gets a new Hello");
  }
  return id;
}

ForwardPlan Runtime::on_forward(bool in_backward, bool cuda) {
  std::lock_guard lock(mu_);
  if (!in_backward) {
    const bool wrap = frozen_ && !named_mode_ && zero_change_count_ > 0 && call_index_ >= zero_change_count_;
    if (!started_ || backward_since_forward_ || explicit_begin_ || wrap) start_pass_locked();
  }
  ForwardPlan plan;
  plan.step = step_;
  plan.recompute = in_backward;
  if (!name_stack_.empty()) {
    named_mode_ = true;
    plan.layer = layer_for_name_locked(name_stack_.back());
  } else if (!in_backward) {
    plan.layer = layer_for_name_locked("attn." + std::to_string(call_index_));
  }
  if (!in_backward) {
    ++call_index_;
    pending_backward_.insert(plan.layer);
  }
  if (plan.layer >= 0) {
    LayerRecord& layer = layers_[static_cast<std::size_t>(plan.layer)];
    layer.cuda = cuda;
    plan.backend = layer.backend;
  }
  return plan;
}

// The layer count is known now: GAUGEWATCH_LAYERS is checked against it.
void Runtime::on_first_backward_locked() {
  frozen_ = true;
  zero_change_count_ = call_index_;
  log_line("first backward: " + std::to_string(layers_.size()) + " attention layer(s), run " + config_.run_id +
           " (id from " + config_.run_id_source + "), rank " + std::to_string(config_.rank) + "/" +
           std::to_string(config_.world_size));
  std::string beyond;
  std::size_t within = 0;
  for (std::uint32_t l : config_.layers) {
    if (l < layers_.size()) {
      ++within;
    } else {
      beyond += (beyond.empty() ? "" : ",") + std::to_string(l);
    }
  }
  if (!beyond.empty()) {
    log_line("WARNING: GAUGEWATCH_LAYERS names layer(s) " + beyond + " but the model has " +
             std::to_string(layers_.size()) + " attention layer(s) (0.." +
             std::to_string(layers_.size() == 0 ? 0 : layers_.size() - 1) + "): " +
             (within == 0 ? "NO layer will be audited" : "those are never audited") +
             "; fix --layers / GAUGEWATCH_LAYERS");
  }
  plan_sampling_locked();
  start_reporter_locked();
  log_coverage_locked();
}

void Runtime::count_call(std::int64_t layer, const CallVerdict& verdict) {
  std::lock_guard lock(mu_);
  coverage_.count(layer, verdict);
  if (!verdict.monitored) {
    log_once("not-monitored:" + verdict.reason,
             "attention calls not monitored: " + verdict.reason + " (counted: stats \"attention_calls\"; logged once)");
  }
}

CoverageReport Runtime::coverage(std::uint64_t since) {
  std::lock_guard lock(mu_);
  return coverage_.report(since);
}

// Logs the coverage summary when what is (not) monitored changed since the
// last time (counts alone do not make a new line).
void Runtime::log_coverage_locked() {
  std::string state;
  const CoverageReport r = coverage_.report(0);
  for (const AttentionCallCount& c : r.calls) state += (c.monitored ? "+" : "-") + c.reason + ";";
  for (const LayerStatus& l : r.layers) state += std::to_string(l.layer) + (l.monitored ? "+" : "-") + l.reason + ";";
  if (state == coverage_logged_) return;
  coverage_logged_ = state;
  log_line(coverage_.summary());
}

void Runtime::warn_if_unmonitored_locked(std::uint64_t steps, const char* what) {
  if (unmonitored_warned_ || steps < kUnmonitoredWarnSteps || coverage_.monitored_calls() > 0) return;
  unmonitored_warned_ = true;
  log_line("WARNING: " + std::to_string(steps) + " " + what + " trained and no attention call monitored (" +
           coverage_.summary() +
           "). Attention the hooks never see: nn.MultiheadAttention(need_weights=True) and other attention "
           "computed with matmul / softmax instead of scaled_dot_product_attention; docs/hooks.md, \"Coverage\"");
}

BackwardPlan Runtime::on_backward(const ForwardPlan& forward) {
  std::lock_guard lock(mu_);
  backward_since_forward_ = true;
  pass_had_backward_ = true;
  if (!frozen_) on_first_backward_locked();
  BackwardPlan plan;
  plan.step = forward.step;
  plan.max_heads = max_heads_;
  plan.max_rows = max_rows_;
  std::int64_t id = forward.layer;
  if (!forward.recompute) {
    auto it = pending_backward_.find(id);
    if (it != pending_backward_.end()) pending_backward_.erase(it);
    plan.backend = forward.backend;
  } else {
    if (id < 0 && !pending_backward_.empty()) id = *pending_backward_.rbegin();
    if (id >= 0) {
      auto it = pending_backward_.find(id);
      if (it != pending_backward_.end()) pending_backward_.erase(it);
      plan.backend = layers_[static_cast<std::size_t>(id)].backend;
    }
    plan.step = step_;
  }
  plan.layer = id;
  if (id < 0 || forked_child_) return plan;
  if (sample_layers_.count(id) != 0 && sampled_done_.insert(id).second && plan.step == step_) {
    plan.sample = true;
    plan.sampled_layers = static_cast<std::uint32_t>(sample_layers_.size());
  }
  if (auto it = capture_arms_.find(id); it != capture_arms_.end()) {
    plan.capture = true;
    if (--it->second == 0) capture_arms_.erase(it);
  }
  return plan;
}

void Runtime::record_backward(std::int64_t layer_id, std::uint64_t step, Backend ran) {
  std::lock_guard lock(mu_);
  ++backward_calls_[static_cast<int>(ran)];
  if (layer_id < 0 || static_cast<std::size_t>(layer_id) >= layers_.size()) return;
  LayerRecord& layer = layers_[static_cast<std::size_t>(layer_id)];
  ++layer.backward_calls;
  layer.last_backward_step = static_cast<std::int64_t>(step);
  if (layer.history.empty() || layer.last_ran != ran) {
    if (!layer.history.empty()) {
      log_line("step " + std::to_string(step) + ": layer " + std::to_string(layer_id) + " '" + layer.name +
               "' backward now runs " + std::string(backend_name(ran)) + " (was " +
               std::string(backend_name(layer.last_ran)) + ")");
    }
    layer.history.emplace_back(step, ran);
    layer.last_ran = ran;
  }
}

void Runtime::count_fallback() {
  std::lock_guard lock(mu_);
  ++fallbacks_;
}

void Runtime::count_audit_skipped(const char* why) {
  std::lock_guard lock(mu_);
  ++audits_skipped_other_;
  ++audits_skipped_reasons_[why];
  log_once(std::string("audit-skip:") + why, std::string("audit sample skipped: ") + why + " (logged once)");
}

void Runtime::optimizer_step() {
  std::lock_guard lock(mu_);
  if (!optimizer_mode_) {
    optimizer_mode_ = true;
    log_line("optimizer steps signalled: a step is now an optimizer step (was: " +
             std::to_string(config_.grad_accum) + " backward pass(es))");
  }
  ++optimizer_steps_pending_;
  ++optimizer_steps_;
  warn_if_unmonitored_locked(optimizer_steps_, "optimizer steps");
}

void Runtime::use_optimizer_steps() {
  std::lock_guard lock(mu_);
  optimizer_mode_ = true;
}

void Runtime::begin_pass() {
  std::lock_guard lock(mu_);
  explicit_begin_ = true;
}

void Runtime::enter_layer(const std::string& name) {
  std::lock_guard lock(mu_);
  if (name_stack_.size() < 256) name_stack_.push_back(name);
}

void Runtime::exit_layer(const std::string& name) {
  std::lock_guard lock(mu_);
  // Pops up to and including the innermost `name` (a module that raised
  // never ran its exit hook: its entry goes here too).
  for (auto i = name_stack_.size(); i > 0; --i) {
    if (name_stack_[i - 1] == name) {
      name_stack_.resize(i - 1);
      return;
    }
  }
}

void Runtime::start_pass_locked() {
  const auto now = Clock::now();
  // The step advances at this boundary when the pass before it ended a step:
  // optimizer mode: an optimizer step was signalled since the last boundary;
  // otherwise: it ran a backward, and it was the grad_accum-th such pass.
  bool step_boundary = false;
  if (started_ && pass_had_backward_) ++backward_passes_;
  if (started_ && optimizer_mode_) {
    step_boundary = optimizer_steps_pending_ > 0;
    optimizer_steps_pending_ = 0;
  } else if (started_ && pass_had_backward_) {
    step_boundary = backward_passes_ % config_.grad_accum == 0;
  }
  if (step_boundary) {
    ++step_;
    const double elapsed_us = std::chrono::duration<double, std::micro>(now - last_boundary_).count();
    // The audit may use overhead_budget of the training time; credit is capped
    // at ten seconds' worth so a long idle period does not buy a burst.
    credit_us_ = std::min(credit_us_ + overhead_budget_ * elapsed_us, overhead_budget_ * 10e6);
    last_boundary_ = now;
  }
  if (!started_) last_boundary_ = now;
  started_ = true;
  ++passes_;
  call_index_ = 0;
  backward_since_forward_ = false;
  pass_had_backward_ = false;
  explicit_begin_ = false;
  pending_backward_.clear();
  // Commands take effect at step boundaries (and before the first backward),
  // so one step never mixes two backends of a layer; a pass within a step
  // (a micro-batch, an eval forward) leaves them pending.
  if (step_boundary || !frozen_) apply_commands_locked();
  plan_sampling_locked();
  if (step_boundary) {
    log_coverage_locked();
    if (!optimizer_mode_) warn_if_unmonitored_locked(step_, "steps");
    write_stats_file_locked();
  }
}

void Runtime::plan_sampling_locked() {
  if (!frozen_ || planned_step_ == static_cast<std::int64_t>(step_)) return;
  planned_step_ = static_cast<std::int64_t>(step_);
  sample_layers_.clear();
  sampled_done_.clear();
  if (every_n_steps_ == 0 || step_ % every_n_steps_ != 0 || layers_.empty()) return;
  std::vector<std::int64_t> candidates;
  if (!config_.layers.empty()) {
    for (std::uint32_t l : config_.layers) {
      if (l < layers_.size()) candidates.push_back(l);
    }
  } else {
    for (std::size_t l = 0; l < layers_.size(); ++l) candidates.push_back(static_cast<std::int64_t>(l));
  }
  if (candidates.empty()) return;
  if (credit_us_ < 0.0) {
    ++audits_skipped_budget_;
    return;
  }
  const auto n = std::max<std::size_t>(
      1, std::min(candidates.size(),
                  static_cast<std::size_t>(std::ceil(layer_fraction_ * static_cast<double>(candidates.size())))));
  for (std::size_t i = 0; i < n; ++i) {
    sample_layers_.insert(candidates[(rotation_ * n + i) % candidates.size()]);
  }
  ++rotation_;
}

void Runtime::submit_sample(const SampleData& measured) {
  SampleData sample = measured;
  Reporter* reporter = nullptr;
  {
    std::lock_guard lock(mu_);
    if (sample.layer >= 0) {
      if (const LayerStatus* status = coverage_.layer(static_cast<std::size_t>(sample.layer))) {
        sample.correcting_backends = status->correcting_backends;
      }
    }
    credit_us_ -= sample.audit_us;
    audit_us_total_ += sample.audit_us;
    ++samples_submitted_;
    if (sample.layer >= 0 && static_cast<std::size_t>(sample.layer) < layers_.size()) {
      LayerRecord& layer = layers_[static_cast<std::size_t>(sample.layer)];
      ++layer.samples;
      layer.latest_step = static_cast<std::int64_t>(sample.step);
      layer.latest = sample.metrics;
    }
    reporter = reporter_.get();
  }
  if (reporter != nullptr) reporter->enqueue_sample(std::move(sample));
}

HelloInfo Runtime::hello() {
  std::lock_guard lock(mu_);
  HelloInfo hello;
  hello.run_id = config_.run_id;
  hello.rank = config_.rank;
  hello.local_rank = config_.local_rank;
  hello.world_size = config_.world_size;
  hello.host = config_.host;
  hello.pid = config_.pid;
  hello.torch_version = torch_version_;
  hello.cuda_version = cuda_version_;
  hello.driver_version = driver_version_;
  hello.hook_version = GAUGEWATCH_HOOKS_VERSION;
  hello.gpu_uuid = gpu_uuid_;
  hello.pci_bus_id = pci_bus_id_;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    hello.layers.push_back(LayerInfo{static_cast<std::uint32_t>(i), layers_[i].name, layers_[i].backend});
  }
  return hello;
}

std::uint64_t Runtime::layers_version() {
  std::lock_guard lock(mu_);
  return version_;
}

std::uint64_t Runtime::current_step() {
  std::lock_guard lock(mu_);
  return step_;
}

void Runtime::set_versions(std::string torch, std::string cuda, std::string driver) {
  std::lock_guard lock(mu_);
  torch_version_ = std::move(torch);
  cuda_version_ = std::move(cuda);
  driver_version_ = std::move(driver);
}

void Runtime::set_gpu_identity(std::string uuid, std::string pci_bus_id) {
  std::lock_guard lock(mu_);
  gpu_uuid_ = std::move(uuid);
  pci_bus_id_ = std::move(pci_bus_id);
}

void Runtime::set_backend_status(const std::string& backend, const std::string& status) {
  std::lock_guard lock(mu_);
  backend_status_[backend] = status;
}

void Runtime::set_timing_source(const std::string& source, const std::string& cupti_status) {
  std::lock_guard lock(mu_);
  timing_source_ = source;
  cupti_status_ = cupti_status;
}

void Runtime::count_timing(const std::string& source) {
  std::lock_guard lock(mu_);
  ++timed_by_[source];
}

void Runtime::count_audit_device(const std::string& device) {
  std::lock_guard lock(mu_);
  ++audits_by_device_[device];
}

void Runtime::start_reporter_locked() {
  if (reporter_ || shut_down_ || forked_child_) return;
  if (!interpreter_exit_registered_) {
    interpreter_exit_registered_ = true;
    register_interpreter_exit();
  }
  if (!config_.agent_enabled()) {
    log_once("no-agent", "no agent configured (GAUGEWATCH_SOCKET=none): local log only, no switching");
    return;
  }
  reporter_ = std::make_unique<Reporter>(config_, this);
}

std::vector<std::string> Runtime::layer_names() {
  std::lock_guard lock(mu_);
  std::vector<std::string> names;
  for (const auto& l : layers_) names.push_back(l.name);
  return names;
}

std::string format_cuda_version(int version) {
  if (version <= 0) return "";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

}  // namespace gaugewatch::hooks
