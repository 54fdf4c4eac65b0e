#include "hooks/runtime_state.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <pthread.h>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "hooks/cupti_timing.h"
#include "hooks/log.h"

#ifndef GAUGEWATCH_HOOKS_VERSION
#define GAUGEWATCH_HOOKS_VERSION "0.0.0"
#endif

namespace gaugewatch::hooks {

namespace v1 = gaugewatch::v1;
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

BackwardPlan Runtime::on_backward(const ForwardPlan& forward) {
  std::lock_guard lock(mu_);
  backward_since_forward_ = true;
  pass_had_backward_ = true;
  if (!frozen_) {
    frozen_ = true;
    zero_change_count_ = call_index_;
    log_line("first backward: " + std::to_string(layers_.size()) + " attention layer(s), run " + config_.run_id +
             ", rank " + std::to_string(config_.rank) + "/" + std::to_string(config_.world_size));
    plan_sampling_locked();
    start_reporter_locked();
  }
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
}

void Runtime::use_optimizer_steps() {
  std::lock_guard lock(mu_);
  optimizer_mode_ = true;
}

void Runtime::prepare_fork() { mu_.lock(); }

void Runtime::after_fork_parent() { mu_.unlock(); }

void Runtime::after_fork_child() {
  // This thread took mu_ in prepare_fork() and is the child's only thread.
  forked_child_ = true;
  (void)reporter_.release();  // its threads are the parent's: leak it, never touch it
  shutdown_hooks_.clear();    // the auditor's thread is the parent's too
  shut_down_ = true;          // exit: nothing to flush or join here
  sample_layers_.clear();
  capture_arms_.clear();
  mu_.unlock();
}

bool Runtime::forked_child() {
  std::lock_guard lock(mu_);
  return forked_child_;
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
  if (!config_.stats_file.empty() && !forked_child_) {
    const std::string json = stats_json_locked();
    const std::string tmp = config_.stats_file + ".tmp";
    std::ofstream(tmp) << json << "\n";
    std::rename(tmp.c_str(), config_.stats_file.c_str());
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

void Runtime::ack_locked(std::uint64_t id, bool applied, const std::string& detail) {
  if (id != 0) (applied ? commands_applied_ : commands_rejected_) += 1;
  if (!applied) log_line("command " + std::to_string(id) + " rejected: " + detail);
  if (id == 0 || !reporter_) return;
  v1::CommandAck ack;
  ack.set_command_id(id);
  ack.set_status(applied ? v1::ACK_STATUS_APPLIED : v1::ACK_STATUS_REJECTED);
  ack.set_applied_step(applied ? step_ : 0);
  ack.set_detail(detail.substr(0, 4000));
  reporter_->enqueue_ack(std::move(ack));
}

void Runtime::apply_commands_locked() {
  std::vector<v1::Command> commands;
  commands.swap(pending_commands_);
  for (const v1::Command& command : commands) apply_command_locked(command);
}

void Runtime::apply_command_locked(const v1::Command& command) {
  const std::uint64_t id = command.command_id();
  switch (command.action_case()) {
    case v1::Command::kSwitchBackend: {
      const auto& sw = command.switch_backend();
      const auto backend = from_wire_backend(sw.backend());
      if (!backend) return ack_locked(id, false, "unknown backend " + std::to_string(sw.backend()));
      std::vector<std::size_t> targets;
      if (sw.layers_size() == 0) {
        for (std::size_t l = 0; l < layers_.size(); ++l) targets.push_back(l);
      }
      for (std::uint32_t l : sw.layers()) {
        if (l >= layers_.size()) {
          return ack_locked(id, false, "layer " + std::to_string(l) + " out of range (" +
                                           std::to_string(layers_.size()) + " layers)");
        }
        targets.push_back(l);
      }
      std::string list;
      for (std::size_t l : targets) {
        layers_[l].backend = *backend;
        list += (list.empty() ? "" : ",") + std::to_string(l);
      }
      log_line("step " + std::to_string(step_) + ": command " + std::to_string(id) + " switches layer(s) [" + list +
               "] to " + std::string(backend_name(*backend)) +
               (command.reason().empty() ? "" : " (" + command.reason() + ")"));
      return ack_locked(id, true, "");
    }
    case v1::Command::kSetSampling:
      apply_sampling_locked(command.set_sampling());
      return ack_locked(id, true, "");
    case v1::Command::kCapture: {
      const auto& capture = command.capture();
      if (config_.capture_dir.empty()) return ack_locked(id, false, "capture disabled: GAUGEWATCH_CAPTURE_DIR is unset");
      if (capture.layer() >= layers_.size()) {
        return ack_locked(id, false, "capture layer " + std::to_string(capture.layer()) + " out of range");
      }
      const std::uint32_t count = std::clamp<std::uint32_t>(capture.count(), 1, 100);
      capture_arms_[capture.layer()] += count;
      log_line("step " + std::to_string(step_) + ": command " + std::to_string(id) + " captures " +
               std::to_string(count) + " call(s) of layer " + std::to_string(capture.layer()));
      return ack_locked(id, true, "");
    }
    default:
      return ack_locked(id, false, "command without an action");
  }
}

void Runtime::apply_sampling_locked(const v1::SamplingPolicy& p) {
  if (p.every_n_steps() != 0) every_n_steps_ = p.every_n_steps();
  if (p.layer_fraction() > 0.0 && p.layer_fraction() <= 1.0) layer_fraction_ = p.layer_fraction();
  if (p.max_heads() != 0) max_heads_ = p.max_heads();
  if (p.max_rows() != 0) max_rows_ = p.max_rows();
  if (p.overhead_budget() > 0.0 && p.overhead_budget() <= 1.0) overhead_budget_ = p.overhead_budget();
}

void Runtime::submit_sample(v1::Sample sample, double audit_us) {
  Reporter* reporter = nullptr;
  {
    std::lock_guard lock(mu_);
    credit_us_ -= audit_us;
    audit_us_total_ += audit_us;
    ++samples_submitted_;
    if (sample.layer() < layers_.size()) {
      LayerRecord& layer = layers_[sample.layer()];
      ++layer.samples;
      layer.latest_step = static_cast<std::int64_t>(sample.step());
      layer.latest = sample.metrics();
    }
    reporter = reporter_.get();
  }
  if (reporter != nullptr) reporter->enqueue_sample(std::move(sample));
}

void Runtime::on_command(v1::Command command) {
  std::lock_guard lock(mu_);
  if (pending_commands_.size() >= 4096) {
    ack_locked(command.command_id(), false, "too many pending commands");
    return;
  }
  pending_commands_.push_back(std::move(command));
}

void Runtime::on_sampling(const v1::SamplingPolicy& policy) {
  v1::Command command;  // command_id 0: applied at the boundary, not acknowledged
  *command.mutable_set_sampling() = policy;
  on_command(std::move(command));
}

v1::Hello Runtime::hello() {
  std::lock_guard lock(mu_);
  v1::Hello hello;
  hello.set_protocol_version(v1::PROTOCOL_VERSION_1);
  hello.set_run_id(config_.run_id);
  hello.set_rank(config_.rank);
  hello.set_local_rank(config_.local_rank);
  hello.set_world_size(config_.world_size);
  hello.set_host(config_.host.substr(0, 200));
  hello.set_pid(config_.pid);
  hello.set_torch_version(torch_version_);
  hello.set_cuda_version(cuda_version_);
  hello.set_driver_version(driver_version_);
  hello.set_hook_version(GAUGEWATCH_HOOKS_VERSION);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    auto* layer = hello.add_layers();
    layer->set_index(static_cast<std::uint32_t>(i));
    layer->set_name(layers_[i].name.substr(0, 200));
    layer->set_backend(static_cast<v1::Backend>(wire_backend(layers_[i].backend)));
  }
  return hello;
}

std::uint64_t Runtime::layers_version() {
  std::lock_guard lock(mu_);
  return version_;
}

void Runtime::set_versions(std::string torch, std::string cuda, std::string driver) {
  std::lock_guard lock(mu_);
  torch_version_ = std::move(torch);
  cuda_version_ = std::move(cuda);
  driver_version_ = std::move(driver);
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
  if (!config_.agent_enabled()) {
    log_once("no-agent", "no agent configured (GAUGEWATCH_SOCKET=none): local log only, no switching");
    return;
  }
  reporter_ = std::make_unique<Reporter>(config_, this);
}

std::string Runtime::stats_json_locked() {
  nlohmann::json j;
  j["run_id"] = config_.run_id;
  j["rank"] = config_.rank;
  j["world_size"] = config_.world_size;
  j["step"] = step_;
  j["passes"] = passes_;
  j["frozen"] = frozen_;
  j["step_mode"] = optimizer_mode_ ? "optimizer" : "backward";
  j["grad_accum"] = config_.grad_accum;
  j["optimizer_steps"] = optimizer_steps_;
  j["backward_passes"] = backward_passes_ + (pass_had_backward_ ? 1 : 0);
  j["forked_child"] = forked_child_;
  j["cuda_backends"] = backend_status_;
  j["timing"] = {{"source", timing_source_},
                 {"cupti", cupti_status_},
                 {"samples_by_source", timed_by_},
                 {"cupti_busy_skips", cupti::busy_skips()}};
  nlohmann::json calls = nlohmann::json::object();
  for (int b = 0; b < kBackendCount; ++b) calls[std::string(backend_name(static_cast<Backend>(b)))] = backward_calls_[b];
  j["backward_calls"] = calls;
  j["fallbacks"] = fallbacks_;
  j["samples_submitted"] = samples_submitted_;
  j["audits_skipped_budget"] = audits_skipped_budget_;
  j["audits_skipped_other"] = audits_skipped_other_;
  j["audits_skipped_reasons"] = audits_skipped_reasons_;
  j["audit_us_total"] = audit_us_total_;
  j["audits_by_device"] = audits_by_device_;
  j["commands_applied"] = commands_applied_;
  j["commands_rejected"] = commands_rejected_;
  j["sampling"] = {{"every_n_steps", every_n_steps_},
                   {"layer_fraction", layer_fraction_},
                   {"max_heads", max_heads_},
                   {"max_rows", max_rows_},
                   {"overhead_budget", overhead_budget_}};
  if (reporter_) {
    j["reporter"] = {{"connected", reporter_->connected()},
                     {"connects", reporter_->connects()},
                     {"samples_sent", reporter_->sent()},
                     {"samples_dropped", reporter_->dropped()},
                     {"commands_received", reporter_->commands_received()}};
  } else {
    j["reporter"] = nullptr;
  }
  nlohmann::json layers = nlohmann::json::array();
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const LayerRecord& l = layers_[i];
    nlohmann::json history = nlohmann::json::array();
    for (const auto& [step, backend] : l.history) history.push_back({step, std::string(backend_name(backend))});
    // The latest sample's metrics that were set, by their wire names.
    nlohmann::json latest = nlohmann::json::object();
    if (l.latest_step >= 0) {
      latest["step"] = l.latest_step;
      const auto* reflection = l.latest.GetReflection();
      std::vector<const google::protobuf::FieldDescriptor*> fields;
      reflection->ListFields(l.latest, &fields);
      for (const auto* field : fields) {
        if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE) {
          latest[field->name()] = reflection->GetDouble(l.latest, field);
        }
      }
    }
    layers.push_back({{"index", i},
                      {"name", l.name},
                      {"backend", std::string(backend_name(l.backend))},
                      {"cuda", l.cuda},
                      {"backward_calls", l.backward_calls},
                      {"samples", l.samples},
                      {"last_backward_step", l.last_backward_step},
                      {"history", history},
                      {"latest", latest}});
  }
  j["layers"] = layers;
  return j.dump();
}

std::string Runtime::stats_json() {
  std::lock_guard lock(mu_);
  return stats_json_locked();
}

std::vector<std::string> Runtime::layer_names() {
  std::lock_guard lock(mu_);
  std::vector<std::string> names;
  for (const auto& l : layers_) names.push_back(l.name);
  return names;
}

bool Runtime::flush(double timeout_s) {
  Reporter* reporter = nullptr;
  {
    std::lock_guard lock(mu_);
    reporter = reporter_.get();
  }
  return reporter == nullptr || reporter->flush(timeout_s);
}

void Runtime::write_stats_file() {
  std::lock_guard lock(mu_);
  // A process that never made an attention call writes nothing: under
  // LD_PRELOAD every program the trainer starts (a shell, a tool, the test
  // watchdog) loads the library, and must not overwrite the trainer's file.
  if (config_.stats_file.empty() || forked_child_ || !started_) return;
  const std::string tmp = config_.stats_file + ".tmp";
  std::ofstream(tmp) << stats_json_locked() << "\n";
  std::rename(tmp.c_str(), config_.stats_file.c_str());
}

void Runtime::add_shutdown_hook(std::function<void()> hook) {
  std::lock_guard lock(mu_);
  shutdown_hooks_.push_back(std::move(hook));
}

void Runtime::shutdown() {
  std::vector<std::function<void()>> hooks;
  Reporter* reporter = nullptr;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    hooks.swap(shutdown_hooks_);
    reporter = reporter_.get();
  }
  const auto t0 = Clock::now();
  for (auto& hook : hooks) hook();  // the auditor drains its queue (bounded)
  if (reporter != nullptr) {
    reporter->flush(1.5);
    reporter->stop(1.0);
  }
  write_stats_file();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (s > 0.5) log_line("exit: threads stopped in " + std::to_string(s).substr(0, 5) + " s");
}

namespace {
// Set once the runtime exists (the fork handlers run only after that).
Runtime* g_runtime_for_fork = nullptr;
}  // namespace

Runtime& runtime() {
  static Runtime* instance = [] {
    std::vector<std::string> warnings;
    HookConfig config = load_config([](const char* name) { return std::getenv(name); }, &warnings);
    set_log_file(config.log_file);
    for (const auto& w : warnings) log_line("config: " + w);
    auto* r = new Runtime(std::move(config));
    std::atexit([] { runtime().shutdown(); });
    // A fork (DataLoader workers, os.fork) copies the state but not the
    // threads: the child turns monitoring off (runtime_state.h).
    ::pthread_atfork([] { g_runtime_for_fork->prepare_fork(); log_prepare_fork(); },
                     [] { log_after_fork(); g_runtime_for_fork->after_fork_parent(); },
                     [] {
                       log_after_fork();
                       g_runtime_for_fork->after_fork_child();
                       log_line("forked child: monitoring is off in this process (no samples, captures, agent "
                                "stream or stats file; the layers keep their backends)");
                     });
    g_runtime_for_fork = r;
    return r;
  }();
  return *instance;
}

}  // namespace gaugewatch::hooks

namespace gaugewatch::hooks {

v1::Sample to_proto(const SampleData& d) {
  v1::Sample sample;
  sample.set_step(d.step);
  sample.set_layer(static_cast<std::uint32_t>(d.layer));
  sample.set_backend(static_cast<v1::Backend>(wire_backend(d.backend)));
  auto* metrics = sample.mutable_metrics();
  const auto& catalogue = reference::metric_catalogue();
  for (std::size_t i = 0; i < catalogue.size(); ++i) {
    const double value = d.metrics[i];
    if (!std::isfinite(value) || value < 0.0) continue;  // the agent takes finite values >= 0 only
    const auto* field = metrics->GetDescriptor()->FindFieldByName(std::string(catalogue[i].name));
    if (field == nullptr || field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE) continue;
    metrics->GetReflection()->SetDouble(metrics, field, value);
  }
  auto* shape = sample.mutable_shape();
  shape->set_batch(d.batch);
  shape->set_query_heads(d.query_heads);
  shape->set_key_value_heads(d.key_value_heads);
  shape->set_query_len(d.query_len);
  shape->set_key_len(d.key_len);
  shape->set_head_dim(d.head_dim);
  shape->set_is_causal(d.is_causal);
  shape->set_dtype(d.dtype);
  auto* t = sample.mutable_timings();
  t->set_backward_us(std::isfinite(d.backward_us) ? std::max(0.0, d.backward_us) : 0.0);
  t->set_audit_us(std::isfinite(d.audit_us) ? std::max(0.0, d.audit_us) : 0.0);
  t->set_queue_us(std::isfinite(d.queue_us) ? std::max(0.0, d.queue_us) : 0.0);
  sample.set_unix_time_ns(d.unix_time_ns);
  return sample;
}

std::string format_cuda_version(int version) {
  if (version <= 0) return "";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

namespace rt {
const HookConfig& config() { return runtime().config(); }
ForwardPlan on_forward(bool in_backward, bool cuda) { return runtime().on_forward(in_backward, cuda); }
BackwardPlan on_backward(const ForwardPlan& plan) { return runtime().on_backward(plan); }
void record_backward(std::int64_t layer, std::uint64_t step, Backend ran) {
  runtime().record_backward(layer, step, ran);
}
void count_fallback() { runtime().count_fallback(); }
void count_audit_skipped(const char* why) { runtime().count_audit_skipped(why); }
void submit_sample(const SampleData& sample) { runtime().submit_sample(to_proto(sample), sample.audit_us); }
void add_shutdown_hook(std::function<void()> hook) { runtime().add_shutdown_hook(std::move(hook)); }
void shutdown() { runtime().shutdown(); }
void set_versions(std::string torch, std::string cuda, std::string driver) {
  runtime().set_versions(std::move(torch), std::move(cuda), std::move(driver));
}
void set_backend_status(const std::string& backend, const std::string& status) {
  runtime().set_backend_status(backend, status);
}
void set_timing_source(const std::string& source, const std::string& cupti_status) {
  runtime().set_timing_source(source, cupti_status);
}
void count_timing(const std::string& source) { runtime().count_timing(source); }
void count_audit_device(const std::string& device) { runtime().count_audit_device(device); }
void optimizer_step() { runtime().optimizer_step(); }
void use_optimizer_steps() { runtime().use_optimizer_steps(); }
}  // namespace rt

}  // namespace gaugewatch::hooks
