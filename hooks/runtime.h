#pragma once
// The hooks' state, free of torch and of the wire format: layers and their
// backends, the pass / step boundary, the sampler, pending agent commands,
// counters. The interceptor (interceptor.cpp) asks it what to do at every
// intercepted forward and backward; the reporter (reporter.h) feeds it
// commands and drains samples.
//
// Passes and steps (docs/hooks.md):
//   A *pass* starts at an intercepted forward call (outside a backward) when a
//   backward has run since the previous forward call, when begin_pass() was
//   called (the Python helper calls it from the model's forward pre-hook; C++
//   trainers may call it), or, in zero-change mode, when the call index
//   reaches the layer count learned by the first backward (eval / no-grad
//   forwards then wrap instead of inventing layers). A *step* is a pass that
//   ran a backward: the step number advances at the first pass boundary after
//   a pass with a backward. Commands and sampling changes are applied at step
//   boundaries; a call's backward uses the backend its layer had at the
//   call's forward. The stats file is rewritten at every step boundary.
//   Forward calls made during a backward (activation checkpointing recompute)
//   do not count; their backward, if any (reentrant checkpointing), takes the
//   highest layer of the pass that has not run its backward yet (backward
//   visits layers in reverse order), or the module name when one is set.
//
// Coverage: a one-line summary is logged after the first backward and at
// step boundaries when it changed; kUnmonitoredWarnSteps steps without a
// monitored attention call log a warning.
//
// Files: runtime.cpp (layers, passes, steps, sampler, coverage), runtime_commands.cpp
// (agent commands and acks), stats_writer.cpp (stats JSON and file),
// process_runtime.cpp (the process-wide instance: configuration, fork, exit).

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "hooks/agent_messages.h"
#include "hooks/config.h"
#include "hooks/pending_switches.h"
#include "hooks/coverage.h"
#include "hooks/reporter.h"
#include "kernels/common/backend.h"

namespace gaugewatch::hooks {

// What the interceptor decided at a forward call.
struct ForwardPlan {
  std::int64_t layer = -1;  // -1: a recompute call whose layer is resolved at backward
  std::uint64_t step = 0;
  Backend backend = Backend::kStock;
  bool recompute = false;
};

// What to do at that call's backward.
struct BackwardPlan {
  std::int64_t layer = -1;  // -1: unknown layer (stock, not sampled)
  std::uint64_t step = 0;
  Backend backend = Backend::kStock;
  bool sample = false;
  std::uint32_t sampled_layers = 0;  // with sample: layers sampled in this step (the auditor's queue takes them all)
  bool capture = false;
  std::uint32_t max_heads = 1;
  std::uint32_t max_rows = 128;
};

struct LayerRecord {
  std::string name;
  Backend backend = Backend::kStock;  // what its next forward's backward will run
  bool cuda = false;                  // last call was on a CUDA device
  std::uint64_t backward_calls = 0;
  std::uint64_t samples = 0;
  std::int64_t last_backward_step = -1;
  Backend last_ran = Backend::kStock;
  // (first step, backend) each time the backward that actually ran changed.
  std::vector<std::pair<std::uint64_t, Backend>> history;
  // The metrics of the layer's latest submitted sample (stats "latest").
  std::int64_t latest_step = -1;
  std::array<double, reference::kMetricCount> latest{};
};

class Runtime final : public Reporter::Source {
 public:
  explicit Runtime(HookConfig config);
  ~Runtime() override;
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const HookConfig& config() const { return config_; }

  // --- called by the interceptor (training thread) --------------------------
  ForwardPlan on_forward(bool in_backward, bool cuda);
  BackwardPlan on_backward(const ForwardPlan& plan);
  // After the backward ran: which backend produced the gradient (a fallback
  // to stock is recorded as stock).
  void record_backward(std::int64_t layer, std::uint64_t step, Backend ran);
  void count_fallback();
  void count_audit_skipped(const char* why);
  // One training attention call (coverage.h); `layer` -1: outside the layers
  // (the math path). Recompute calls of checkpointing are not counted.
  void count_call(std::int64_t layer, const CallVerdict& verdict);

  // --- steps (docs/hooks.md "Layers, passes and steps") ----------------------
  // An optimizer step happened (the helper's global optimizer hook,
  // gaugewatch_hooks.step(), gaugewatch::hooks::end_step()): the step number
  // advances at the next pass boundary. The first call switches the runtime
  // to optimizer steps for good (backward passes no longer count).
  void optimizer_step();
  // Switches to optimizer steps before the first one (the helper does at load).
  void use_optimizer_steps();

  // --- fork (pthread_atfork; registered by runtime()) -----------------------
  // prepare: takes the lock so the child inherits it in a known state;
  // parent: releases it; child: releases it and turns monitoring off in the
  // child (no sampling, capture, agent stream or stats file; the threads of
  // the parent do not exist there and their objects are leaked, not touched).
  void prepare_fork();
  void after_fork_parent();
  void after_fork_child();
  bool forked_child();

  // --- layer names (Python helper, C++ API) ---------------------------------
  void begin_pass();
  void enter_layer(const std::string& name);
  void exit_layer(const std::string& name);

  // --- auditor / reporter ---------------------------------------------------
  void submit_sample(const SampleData& sample);
  void on_command(Command command) override;  // reporter thread
  void on_sampling(const SamplingPolicy& policy) override;
  HelloInfo hello() override;
  std::uint64_t layers_version() override;
  std::uint64_t current_step() override;
  CoverageReport coverage(std::uint64_t since) override;
  void set_versions(std::string torch, std::string cuda, std::string driver);
  // The process's GPU for the Hello (set at its first CUDA attention call).
  void set_gpu_identity(std::string uuid, std::string pci_bus_id);
  // What the one-time probe of gaugewatch::attention_backward found for a
  // backend on CUDA ("available", or "unavailable: <why>"): stats "cuda_backends".
  void set_backend_status(const std::string& backend, const std::string& status);
  // The timing source of sampled CUDA backwards ("cupti" | "cuda_events") and
  // why CUPTI is not used when it is not; a sample timed by `source`.
  void set_timing_source(const std::string& source, const std::string& cupti_status);
  void count_timing(const std::string& source);
  // Where a submitted sample's metrics were computed: "cuda" or "cpu".
  void count_audit_device(const std::string& device);

  // --- introspection ----------------------------------------------------------
  std::string stats_json();
  std::vector<std::string> layer_names();
  // Waits for the audits queued so far (the auditor's drain, when one
  // registered), then for the reporter to send; false when timeout_s passed.
  bool flush(double timeout_s);
  void set_audit_drain(std::function<bool(double)> drain);
  void write_stats_file();
  // Flushes (bounded), stops the threads, writes the stats file; idempotent.
  // Called at exit, and earlier by an exit handler registered after CUDA /
  // CUPTI initialized (so that it runs before their own teardown).
  void shutdown();
  // Also runs shutdown() at the Python interpreter's exit, where there is one.
  void register_interpreter_exit();
  void add_shutdown_hook(std::function<void()> hook);

 private:
  std::int64_t layer_for_name_locked(const std::string& name);
  void start_pass_locked();
  void on_first_backward_locked();
  void apply_commands_locked();
  void apply_command_locked(const Command& command);
  void apply_switch_locked(const Command& command, const SwitchBackend& sw);
  // Queues a switch with an effective step, or rejects it when that step has
  // begun; at each boundary applies the waiting switches whose step begins.
  void wait_for_step_locked(Command command);
  void apply_due_switches_locked();
  void apply_capture_locked(const Command& command, const CaptureOperands& capture);
  void apply_sampling_locked(const SamplingPolicy& policy);
  void plan_sampling_locked();
  void log_coverage_locked();
  void warn_if_unmonitored_locked(std::uint64_t steps, const char* what);
  void ack_locked(std::uint64_t id, bool applied, const std::string& detail);
  void start_reporter_locked();
  std::string stats_json_locked();
  void write_stats_file_locked();

  HookConfig config_;
  std::mutex mu_;
  std::vector<LayerRecord> layers_;
  std::map<std::string, std::int64_t> by_name_;
  std::vector<std::string> name_stack_;
  bool named_mode_ = false;
  bool frozen_ = false;             // the first backward has run
  std::uint64_t zero_change_count_ = 0;
  std::uint64_t version_ = 0;       // bumped when layers are added

  bool started_ = false;
  bool explicit_begin_ = false;
  bool backward_since_forward_ = false;
  bool pass_had_backward_ = false;
  std::uint64_t call_index_ = 0;
  std::multiset<std::int64_t> pending_backward_;
  std::uint64_t step_ = 0;
  std::uint64_t passes_ = 0;
  std::chrono::steady_clock::time_point last_boundary_{};

  // Sampler.
  std::uint32_t every_n_steps_;
  double layer_fraction_;
  std::uint32_t max_heads_;
  std::uint32_t max_rows_;
  double overhead_budget_;
  std::set<std::int64_t> sample_layers_;
  std::set<std::int64_t> sampled_done_;
  std::int64_t planned_step_ = -1;
  std::uint64_t rotation_ = 0;
  double credit_us_ = 0.0;
  std::map<std::int64_t, std::uint32_t> capture_arms_;

  std::vector<Command> pending_commands_;
  PendingSwitches<Command> waiting_switches_;  // switches waiting for their effective step
  std::map<std::string, std::string> backend_status_;  // CUDA probe results
  std::string timing_source_ = "host_clock";            // until a CUDA sample is timed
  std::string cupti_status_ = "not tried";
  std::map<std::string, std::uint64_t> timed_by_;
  std::map<std::string, std::uint64_t> audits_by_device_;  // where the samples' metrics were computed
  // Steps: backward passes (grad_accum_ per step) until an optimizer step is signalled.
  bool optimizer_mode_ = false;
  std::uint64_t optimizer_steps_pending_ = 0;
  std::uint64_t optimizer_steps_ = 0;
  std::uint64_t backward_passes_ = 0;  // passes that ran a backward (micro-batches)
  bool forked_child_ = false;
  bool interpreter_exit_registered_ = false;  // register_interpreter_exit() ran
  std::string torch_version_, cuda_version_, driver_version_;
  std::string gpu_uuid_, pci_bus_id_;

  // Counters.
  std::array<std::uint64_t, kBackendCount> backward_calls_{};
  std::uint64_t fallbacks_ = 0;
  std::uint64_t samples_submitted_ = 0;
  std::uint64_t audits_skipped_budget_ = 0;
  std::uint64_t audits_skipped_other_ = 0;
  std::map<std::string, std::uint64_t> audits_skipped_reasons_;  // why, for audits_skipped_other_
  std::uint64_t commands_applied_ = 0;
  std::uint64_t commands_rejected_ = 0;
  double audit_us_total_ = 0.0;

  Coverage coverage_;
  std::string coverage_logged_;  // the (monitored, reason) / layer state last logged
  bool unmonitored_warned_ = false;

  std::unique_ptr<Reporter> reporter_;
  std::vector<std::function<void()>> shutdown_hooks_;
  std::function<bool(double)> audit_drain_;
  bool shut_down_ = false;
};

// Steps (or optimizer steps) trained without a monitored attention call
// before the hooks say so.
inline constexpr std::uint64_t kUnmonitoredWarnSteps = 10;

// The process-wide runtime, created (configuration read and checked, atexit
// registered) on first use and never destroyed (process_runtime.cpp).
Runtime& runtime();

// "major.minor" of a CUDA version number as cudaRuntimeGetVersion /
// cudaDriverGetVersion return it (1000 * major + 10 * minor: 13000 -> "13.0",
// 12040 -> "12.4"); "" for 0 or less (no driver, no CUDA).
std::string format_cuda_version(int version);

}  // namespace gaugewatch::hooks
