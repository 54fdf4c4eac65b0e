#pragma once
// The hooks' state, free of torch: layers and their backends, the pass / step
// boundary, the sampler, pending agent commands, counters. The interceptor
// (interceptor.cpp) asks it what to do at every intercepted forward and
// backward; the reporter (reporter.h) feeds it commands and drains samples.
//
// Passes and steps (docs/hooks.md):
//   A *pass* starts at an intercepted forward call (outside a backward) when a
//   backward has run since the previous forward call, when begin_pass() was
//   called (the Python helper calls it from the model's forward pre-hook; C++
//   trainers may call it), or, in zero-change mode, when the call index
//   reaches the layer count learned by the first backward (eval / no-grad
//   forwards then wrap instead of inventing layers). A *step* is a pass that
//   ran a backward: the step number advances at the first pass boundary after
//   a pass with a backward. Commands and sampling changes are applied at pass
//   boundaries; a call's backward uses the backend its layer had at the
//   call's forward.
//   Forward calls made during a backward (activation checkpointing recompute)
//   do not count; their backward, if any (reentrant checkpointing), takes the
//   highest layer of the pass that has not run its backward yet (backward
//   visits layers in reverse order), or the module name when one is set.

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hooks/backend.h"
#include "hooks/config.h"
#include "kernels/reference/metric_catalogue.h"

// The facade the torch translation units use (no proto types here).
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

// One audited call, as the auditor measured it.
struct SampleData {
  std::uint64_t step = 0;
  std::int64_t layer = 0;
  Backend backend = Backend::kStock;
  std::array<double, reference::kMetricCount> metrics{};  // catalogue order; NaN: not computed
  std::uint32_t batch = 0, query_heads = 0, key_value_heads = 0, query_len = 0, key_len = 0, head_dim = 0;
  bool is_causal = false;
  std::string dtype;
  double backward_us = 0.0, audit_us = 0.0, queue_us = 0.0;
  std::int64_t unix_time_ns = 0;
};

namespace rt {
const HookConfig& config();
ForwardPlan on_forward(bool in_backward, bool cuda);
BackwardPlan on_backward(const ForwardPlan& plan);
void record_backward(std::int64_t layer, std::uint64_t step, Backend ran);
void count_fallback();
void count_audit_skipped(const char* why);
void submit_sample(const SampleData& sample);
void add_shutdown_hook(std::function<void()> hook);
// Flushes (bounded), stops the threads, writes the stats file; idempotent.
// Called at exit, and earlier by an exit handler registered after CUDA /
// CUPTI initialized (so that it runs before their own teardown).
void shutdown();
void set_versions(std::string torch, std::string cuda, std::string driver);
void set_backend_status(const std::string& backend, const std::string& status);
void set_timing_source(const std::string& source, const std::string& cupti_status);
void count_timing(const std::string& source);
// Where a submitted sample's metrics were computed: "cuda" or "cpu".
void count_audit_device(const std::string& device);
void optimizer_step();
void use_optimizer_steps();
}  // namespace rt

// "major.minor" of a CUDA version number as cudaRuntimeGetVersion /
// cudaDriverGetVersion return it (1000 * major + 10 * minor: 13000 -> "13.0",
// 12040 -> "12.4"); "" for 0 or less (no driver, no CUDA).
std::string format_cuda_version(int version);

}  // namespace gaugewatch::hooks
