#pragma once
// gaugewatch-agent configuration: embedded defaults, overridden by a YAML
// file, then by environment variables, then by command-line flags. Every flag
// --some-name has the environment variable GAUGEWATCH_AGENT_SOME_NAME.

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "agent/common/default_paths.h"
#include "gaugewatch/v1/types.pb.h"
#include "kernels/reference/metric_catalogue.h"

namespace gaugewatch::agent {

class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bounds every incoming message is checked against (validation.h).
struct Limits {
  std::uint32_t max_layers = 4096;          // layers per Hello
  std::uint32_t max_batch_samples = 4096;   // samples per SampleBatch
  std::uint32_t max_message_bytes = 4u << 20;
  std::uint32_t max_string_bytes = 256;     // host, versions, layer names
  std::uint32_t max_run_id_bytes = 128;
  std::uint32_t max_world_size = 1u << 20;
  std::uint32_t max_shape_dim = 1u << 24;
  std::uint32_t max_streams = 1024;          // trainer streams open at once
  std::uint32_t max_ranks = 4096;            // (run, rank) entries held at once
  std::uint32_t hello_timeout_seconds = 10;  // a stream must send its Hello within this
  // A sample stamped further than this from the agent's clock (either way)
  // is applied, but its age is not observed and it is counted.
  std::uint32_t max_clock_skew_seconds = 300;
};

enum class RuleOp { kGreater, kLess };
enum class DecisionScope { kRank, kRun };

// A threshold rule over one per-sample metric. It fires when `for_samples`
// consecutive samples of a layer cross `threshold`; once fired it stays
// quiet until a sample crosses back past `clear_threshold` (hysteresis).
struct ThresholdRule {
  std::string name;
  reference::MetricId metric = reference::MetricId::kLiveDqDiscrepancy;
  RuleOp op = RuleOp::kGreater;
  double threshold = 0.0;
  double clear_threshold = 0.0;
  std::uint32_t for_samples = 1;
  std::string run_id;                   // empty: every run (global scope)
  std::vector<std::uint32_t> layers;    // empty: every layer
  // Action: switch_backend (backend != UNSPECIFIED) or capture (capture_count > 0).
  gaugewatch::v1::Backend backend = gaugewatch::v1::BACKEND_UNSPECIFIED;
  std::uint32_t capture_count = 0;
  DecisionScope decision_scope = DecisionScope::kRank;
};

// A fleet-wide rule: an instant PromQL query polled from a Prometheus HTTP
// API. Every series in the result with a nonzero value and a `layer` label
// for `for_polls` consecutive polls switches that layer; a `run` label
// narrows it to that run (else all runs), a `rank` label to that rank.
struct PromqlRule {
  std::string name;
  std::string query;
  gaugewatch::v1::Backend backend = gaugewatch::v1::BACKEND_GPROJ;
  std::uint32_t for_polls = 1;
};

struct AgentConfig {
  // Defaults: agent/common/default_paths.h (root: /run, /var/lib; other users:
  // $XDG_RUNTIME_DIR, $XDG_STATE_HOME).
  std::string grpc_socket = default_paths().socket;
  std::uint32_t socket_mode = 0660;
  std::string tcp_listen;        // host:port; empty = no TCP
  std::string tls_cert;          // PEM files, required with tcp_listen
  std::string tls_key;
  std::string admin_token_file;  // required with tcp_listen
  std::string admin_token;       // read from admin_token_file
  std::string http_listen = "127.0.0.1:9477";
  std::string database = default_paths().database;
  double rank_expiry_seconds = 120.0;
  std::uint64_t max_series = 200000;
  bool default_rules = true;
  std::vector<ThresholdRule> rules;  // in addition to the default rule
  std::string prometheus_url;        // http://host:port; empty = no PromQL rules
  double promql_interval_seconds = 30.0;
  std::vector<PromqlRule> promql_rules;
  gaugewatch::v1::SamplingPolicy sampling;  // sent to every trainer in HelloAck
  Limits limits;
  // Per-trainer-stream token bucket on incoming samples: a stream may send
  // `trainer_sample_burst` samples at once and `trainer_sample_rate` per
  // second sustained; the excess is dropped and counted. 0 = unlimited.
  double trainer_sample_rate = 50000.0;
  double trainer_sample_burst = 100000.0;
  // Retention of the SQLite store, enforced by the housekeeping thread every
  // `retention_interval_seconds`. Audit log: at most `audit_max_rows` rows and
  // none older than `audit_max_age_seconds` (0 disables either bound).
  // Decisions: the newest decision of each target scope is always kept (it
  // defines the desired backend); of the superseded ones, the newest
  // `decision_history` are kept.
  std::uint64_t audit_max_rows = 1'000'000;
  double audit_max_age_seconds = 30.0 * 86400.0;
  std::uint64_t decision_history = 10'000;
  double retention_interval_seconds = 300.0;
  std::string log_level = "info";   // event log (agent/common/event_log.h)
  std::string log_format = "text";  // text or json
  std::string config_file;  // where the YAML came from (empty: none)
};

// The embedded default rule (docs/agent.md, Rules): live dQ discrepancy > 5%
// for 3 consecutive samples of a layer -> switch that layer to gproj.
ThresholdRule default_dq_rule();

// The rules the agent runs: the default rule (unless disabled) then `rules`.
std::vector<ThresholdRule> effective_rules(const AgentConfig& config);

// Applies a YAML document to `config`. Throws ConfigError with the key path
// on any unknown key, wrong type or out-of-range value.
void apply_yaml(std::string_view yaml_text, AgentConfig& config);

// What the command line asked for besides settings.
struct CommandLine {
  bool help = false;
  bool version = false;
  bool check_config = false;
  bool print_catalogue = false;
};

// The command line (CLI11, agent_command_line.cpp): loads defaults, the YAML
// file named by --config / GAUGEWATCH_AGENT_CONFIG, then the environment,
// then the flags. `env` returns nullptr for unset variables (std::getenv in
// main, a map in tests). --help and --version only set `command_line`.
// Throws ConfigError naming the flag, variable or key of a refused value.
AgentConfig load_config(const std::vector<std::string>& args,
                        const std::function<const char*(const char*)>& env,
                        CommandLine& command_line);

// --help text listing every flag with its environment variable and default.
std::string help_text();

// Throws ConfigError if the combination is unusable (e.g. TCP without TLS).
void check_config(const AgentConfig& config);

std::optional<reference::MetricId> metric_by_name(std::string_view name);

}  // namespace gaugewatch::agent
