#pragma once
// What the hooks exchange with the agent, as plain C++ (no proto types):
// the runtime, the auditor and the stats writer use these; the reporter
// alone converts them to and from gaugewatch.v1 messages (reporter_wire.h).

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kernels/common/backend.h"
#include "kernels/reference/metric_catalogue.h"

namespace gaugewatch::hooks {

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
  std::vector<Backend> correcting_backends;  // of its layer's calls so far (set by the runtime)
};

// Coverage (coverage.h). What the interceptor decided about one call.
struct CallVerdict {
  bool monitored = true;
  std::string reason;               // "" when monitored
  std::vector<Backend> correcting;  // correcting backends whose kernels take this call
};

struct AttentionCallCount {
  bool monitored = true;
  std::string reason;
  std::uint64_t calls = 0;
};

struct LayerStatus {
  std::uint32_t layer = 0;
  bool monitored = true;
  std::string reason;
  std::vector<Backend> correcting_backends;
};

struct CoverageReport {
  std::uint64_t version = 0;
  std::vector<AttentionCallCount> calls;  // totals so far
  std::vector<LayerStatus> layers;        // changed since the version asked about
};

// Whether a metric value can be reported (the agent takes finite values >= 0 only).
inline bool reportable(double value) { return std::isfinite(value) && value >= 0.0; }

// Hello: who this process is and its layers.
struct LayerInfo {
  std::uint32_t index = 0;
  std::string name;
  Backend backend = Backend::kStock;
};

struct HelloInfo {
  std::string run_id;
  std::uint32_t rank = 0, local_rank = 0, world_size = 1;
  std::string host;
  std::uint32_t pid = 0;
  std::string torch_version, cuda_version, driver_version, hook_version;
  std::string gpu_uuid, pci_bus_id;  // "" on CPU (hooks/cuda_versions.h)
  std::vector<LayerInfo> layers;
};

// Sampling policy; zero fields keep the current value.
struct SamplingPolicy {
  std::uint32_t every_n_steps = 0;
  double layer_fraction = 0.0;
  std::uint32_t max_heads = 0;
  std::uint32_t max_rows = 0;
  double overhead_budget = 0.0;
};

struct SwitchBackend {
  std::vector<std::uint32_t> layers;  // empty: every layer
  Backend backend = Backend::kStock;
  // The step from which every rank of the run runs `backend` (0: the next
  // step boundary); hooks/pending_switches.h.
  std::uint64_t effective_step = 0;
};

struct CaptureOperands {
  std::uint32_t layer = 0;
  std::uint32_t count = 1;
};

struct Command {
  std::uint64_t id = 0;  // 0: not acknowledged (a HelloAck's sampling policy)
  std::variant<std::monostate, SwitchBackend, SamplingPolicy, CaptureOperands> action;
  std::string reason;
  std::uint64_t decision_id = 0;  // the agent's decision (a re-issue of it replaces a waiting switch)
  // Received on the process's first connection right after the agent's
  // HelloAck: a decision the agent held for this run id already (a restore).
  bool restored = false;
  // Set by the transport for a command it could not read (e.g. an unknown
  // backend number): the runtime rejects it with this detail.
  std::string malformed;
};

struct CommandAck {
  std::uint64_t command_id = 0;
  bool applied = false;
  std::uint64_t applied_step = 0;
  std::string detail;
  std::uint64_t rank_step = 0;  // the step the process was running when it acknowledged
};

}  // namespace gaugewatch::hooks
