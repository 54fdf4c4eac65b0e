#include "agent/config/agent_config.h"
#include "agent/config/config_options.h"

#include <algorithm>
#include <iterator>

#include "agent/common/token_file.h"

#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "agent/common/backend_names.h"

namespace gaugewatch::agent {

namespace {

constexpr std::size_t kMaxYamlBytes = 1u << 20;
constexpr int kMaxYamlNesting = 32;

std::uint64_t parse_uint(std::string_view text, std::string_view what, std::uint64_t max) {
  std::uint64_t value = 0;
  int base = 10;
  if (text.size() > 1 && text[0] == '0' && what.find("mode") != std::string_view::npos) base = 8;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) {
    throw ConfigError(std::string(what) + ": expected a non-negative integer, got '" +
                      std::string(text) + "'");
  }
  if (value > max) {
    throw ConfigError(std::string(what) + ": " + std::string(text) + " exceeds " +
                      std::to_string(max));
  }
  return value;
}

double parse_positive(std::string_view text, std::string_view what) {
  std::string copy(text);
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || end != copy.c_str() + copy.size() || errno != 0 || !std::isfinite(value) ||
      value <= 0.0) {
    throw ConfigError(std::string(what) + ": expected a positive number, got '" + copy + "'");
  }
  return value;
}

double parse_non_negative(std::string_view text, std::string_view what) {
  std::string copy(text);
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(copy.c_str(), &end);
  if (copy.empty() || end != copy.c_str() + copy.size() || errno != 0 || !std::isfinite(value) ||
      value < 0.0) {
    throw ConfigError(std::string(what) + ": expected a number >= 0, got '" + copy + "'");
  }
  return value;
}

bool parse_bool(std::string_view text, std::string_view what) {
  if (text == "true" || text == "1" || text == "yes") return true;
  if (text == "false" || text == "0" || text == "no") return false;
  throw ConfigError(std::string(what) + ": expected true or false, got '" + std::string(text) + "'");
}

gaugewatch::v1::Backend parse_backend_or_throw(std::string_view text, std::string_view what) {
  auto backend = parse_backend(text);
  if (!backend) {
    throw ConfigError(std::string(what) + ": unknown backend '" + std::string(text) +
                      "' (expected stock, gproj, pivot or fp32)");
  }
  return *backend;
}

std::string fmt_double(double v) {
  std::ostringstream out;
  out << std::setprecision(12) << v;
  return out.str();
}

}  // namespace

const std::vector<ConfigOption>& config_options() {
  static const std::vector<ConfigOption> kOptions = {
      {"grpc_socket", "unix socket for the hook stream and the admin API",
       [](const AgentConfig& c) { return c.grpc_socket; },
       [](AgentConfig& c, std::string_view v, std::string_view) { c.grpc_socket = v; }},
      {"socket_mode", "permissions of the unix socket (octal)",
       [](const AgentConfig& c) {
         std::ostringstream out;
         out << '0' << std::oct << c.socket_mode;
         return out.str();
       },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.socket_mode = static_cast<std::uint32_t>(parse_uint(v, w, 0777));
       }},
      {"tcp_listen", "optional TCP address host:port (needs tls_cert, tls_key, admin_token_file)",
       [](const AgentConfig& c) { return c.tcp_listen; },
       [](AgentConfig& c, std::string_view v, std::string_view) { c.tcp_listen = v; }},
      {"tls_cert", "PEM certificate chain for TCP", [](const AgentConfig& c) { return c.tls_cert; },
       [](AgentConfig& c, std::string_view v, std::string_view) { c.tls_cert = v; }},
      {"tls_key", "PEM private key for TCP", [](const AgentConfig& c) { return c.tls_key; },
       [](AgentConfig& c, std::string_view v, std::string_view) { c.tls_key = v; }},
      {"admin_token_file",
       "file holding the bearer token admin calls and hook streams over TCP must present",
       [](const AgentConfig& c) { return c.admin_token_file; },
       [](AgentConfig& c, std::string_view v, std::string_view) { c.admin_token_file = v; }},
      {"http_listen", "address host:port of /metrics and /healthz (port 0: any free port)",
       [](const AgentConfig& c) { return c.http_listen; },
       [](AgentConfig& c, std::string_view v, std::string_view) { c.http_listen = v; }},
      {"database", "SQLite file for decisions and the audit log",
       [](const AgentConfig& c) { return c.database; },
       [](AgentConfig& c, std::string_view v, std::string_view) { c.database = v; }},
      {"rank_expiry_seconds", "a rank that sends nothing for this long expires",
       [](const AgentConfig& c) { return fmt_double(c.rank_expiry_seconds); },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.rank_expiry_seconds = parse_positive(v, w);
       }},
      {"max_series", "cardinality guard: most exported per-layer series",
       [](const AgentConfig& c) { return std::to_string(c.max_series); },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.max_series = parse_uint(v, w, 100'000'000);
       }},
      {"default_rules", "run the embedded default rule (dQ discrepancy > 5% x3 -> gproj)",
       [](const AgentConfig& c) { return std::string(c.default_rules ? "true" : "false"); },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.default_rules = parse_bool(v, w);
       }},
      {"log_level", "event log level: trace, debug, info, warn, error, critical, off",
       [](const AgentConfig& c) { return c.log_level; },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         static constexpr std::string_view kLevels[] = {"trace", "debug", "info", "warn", "error", "critical", "off"};
         if (std::find(std::begin(kLevels), std::end(kLevels), v) == std::end(kLevels)) {
           throw ConfigError(std::string(w) + ": expected trace, debug, info, warn, error, critical or off, got '" +
                             std::string(v) + "'");
         }
         c.log_level = v;
       }},
      {"log_format", "event log lines: text, or json (one object per line, for log shippers)",
       [](const AgentConfig& c) { return c.log_format; },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         if (v != "text" && v != "json") {
           throw ConfigError(std::string(w) + ": expected text or json, got '" + std::string(v) + "'");
         }
         c.log_format = v;
       }},
      {"prometheus_url", "Prometheus HTTP API base URL for PromQL rules (http://host:port)",
       [](const AgentConfig& c) { return c.prometheus_url; },
       [](AgentConfig& c, std::string_view v, std::string_view) { c.prometheus_url = v; }},
      {"promql_interval_seconds", "how often PromQL rules are evaluated",
       [](const AgentConfig& c) { return fmt_double(c.promql_interval_seconds); },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.promql_interval_seconds = parse_positive(v, w);
       }},
      {"trainer_sample_rate",
       "samples/s each trainer stream may send sustained; the excess is dropped (0: unlimited)",
       [](const AgentConfig& c) { return fmt_double(c.trainer_sample_rate); },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.trainer_sample_rate = parse_non_negative(v, w);
       }},
      {"trainer_sample_burst", "samples a trainer stream may send at once above the rate",
       [](const AgentConfig& c) { return fmt_double(c.trainer_sample_burst); },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.trainer_sample_burst = parse_non_negative(v, w);
       }},
      {"audit_max_rows", "retention: most audit log rows kept (0: no row bound)",
       [](const AgentConfig& c) { return std::to_string(c.audit_max_rows); },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.audit_max_rows = parse_uint(v, w, 1'000'000'000'000ull);
       }},
      {"audit_max_age_seconds", "retention: audit log rows older than this are deleted (0: no age bound)",
       [](const AgentConfig& c) { return fmt_double(c.audit_max_age_seconds); },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.audit_max_age_seconds = parse_non_negative(v, w);
       }},
      {"decision_history",
       "retention: superseded decisions kept (the newest of each target scope always stays)",
       [](const AgentConfig& c) { return std::to_string(c.decision_history); },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.decision_history = parse_uint(v, w, 1'000'000'000'000ull);
       }},
      {"retention_interval_seconds", "how often retention prunes the SQLite store",
       [](const AgentConfig& c) { return fmt_double(c.retention_interval_seconds); },
       [](AgentConfig& c, std::string_view v, std::string_view w) {
         c.retention_interval_seconds = parse_positive(v, w);
       }},
  };
  return kOptions;
}

std::string config_flag_name(std::string_view key) {
  std::string out(key);
  for (char& ch : out) {
    if (ch == '_') ch = '-';
  }
  return out;
}

std::string config_env_name(std::string_view key) {
  std::string out = "GAUGEWATCH_AGENT_";
  for (char ch : key) out += static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return out;
}

std::string read_text_file(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(std::string(what) + ": cannot open '" + path + "'");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

namespace {

std::string scalar(const YAML::Node& node, const std::string& path) {
  if (!node.IsScalar()) throw ConfigError(path + ": expected a scalar value");
  return node.Scalar();
}

std::vector<std::uint32_t> parse_layers(const YAML::Node& node, const std::string& path) {
  if (!node.IsSequence()) throw ConfigError(path + ": expected a list of layer indices");
  std::vector<std::uint32_t> layers;
  for (std::size_t i = 0; i < node.size(); ++i) {
    layers.push_back(static_cast<std::uint32_t>(
        parse_uint(scalar(node[i], path + "[" + std::to_string(i) + "]"),
                   path + "[" + std::to_string(i) + "]", 1u << 20)));
  }
  return layers;
}

ThresholdRule parse_rule(const YAML::Node& node, const std::string& path) {
  if (!node.IsMap()) throw ConfigError(path + ": expected a mapping");
  ThresholdRule rule;
  bool have_threshold = false;
  bool have_clear = false;
  bool have_metric = false;
  bool have_action = false;
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string where = path + "." + key;
    if (key == "name") {
      rule.name = scalar(item.second, where);
    } else if (key == "metric") {
      const std::string name = scalar(item.second, where);
      auto id = metric_by_name(name);
      if (!id) throw ConfigError(where + ": unknown metric '" + name + "'");
      rule.metric = *id;
      have_metric = true;
    } else if (key == "op") {
      const std::string op = scalar(item.second, where);
      if (op == ">") {
        rule.op = RuleOp::kGreater;
      } else if (op == "<") {
        rule.op = RuleOp::kLess;
      } else {
        throw ConfigError(where + ": expected '>' or '<', got '" + op + "'");
      }
    } else if (key == "threshold" || key == "clear_threshold") {
      const std::string text = scalar(item.second, where);
      char* end = nullptr;
      const double value = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) {
        throw ConfigError(where + ": expected a finite number, got '" + text + "'");
      }
      if (key == "threshold") {
        rule.threshold = value;
        have_threshold = true;
      } else {
        rule.clear_threshold = value;
        have_clear = true;
      }
    } else if (key == "for_samples") {
      rule.for_samples =
          static_cast<std::uint32_t>(parse_uint(scalar(item.second, where), where, 1'000'000));
      if (rule.for_samples == 0) throw ConfigError(where + ": must be >= 1");
    } else if (key == "run_id") {
      rule.run_id = scalar(item.second, where);
    } else if (key == "layers") {
      rule.layers = parse_layers(item.second, where);
    } else if (key == "switch_backend") {
      rule.backend = parse_backend_or_throw(scalar(item.second, where), where);
      have_action = true;
    } else if (key == "capture") {
      rule.capture_count =
          static_cast<std::uint32_t>(parse_uint(scalar(item.second, where), where, 1000));
      have_action = rule.capture_count > 0 || have_action;
    } else if (key == "scope") {
      const std::string scope = scalar(item.second, where);
      if (scope == "rank") {
        rule.decision_scope = DecisionScope::kRank;
      } else if (scope == "run") {
        rule.decision_scope = DecisionScope::kRun;
      } else {
        throw ConfigError(where + ": expected 'rank' or 'run', got '" + scope + "'");
      }
    } else {
      throw ConfigError(where + ": unknown key");
    }
  }
  if (rule.name.empty()) throw ConfigError(path + ": a rule needs a name");
  if (!have_metric) throw ConfigError(path + ": a rule needs a metric");
  if (!have_threshold) throw ConfigError(path + ": a rule needs a threshold");
  if (!have_action) throw ConfigError(path + ": a rule needs switch_backend or capture");
  if (!have_clear) rule.clear_threshold = rule.threshold;
  if ((rule.op == RuleOp::kGreater && rule.clear_threshold > rule.threshold) ||
      (rule.op == RuleOp::kLess && rule.clear_threshold < rule.threshold)) {
    throw ConfigError(path + ": clear_threshold must lie on the safe side of threshold");
  }
  return rule;
}

PromqlRule parse_promql_rule(const YAML::Node& node, const std::string& path) {
  if (!node.IsMap()) throw ConfigError(path + ": expected a mapping");
  PromqlRule rule;
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string where = path + "." + key;
    if (key == "name") {
      rule.name = scalar(item.second, where);
    } else if (key == "query") {
      rule.query = scalar(item.second, where);
    } else if (key == "switch_backend") {
      rule.backend = parse_backend_or_throw(scalar(item.second, where), where);
    } else if (key == "for_polls") {
      rule.for_polls =
          static_cast<std::uint32_t>(parse_uint(scalar(item.second, where), where, 100'000));
      if (rule.for_polls == 0) throw ConfigError(where + ": must be >= 1");
    } else {
      throw ConfigError(where + ": unknown key");
    }
  }
  if (rule.name.empty() || rule.query.empty()) {
    throw ConfigError(path + ": a PromQL rule needs a name and a query");
  }
  return rule;
}

void parse_sampling(const YAML::Node& node, const std::string& path,
                    gaugewatch::v1::SamplingPolicy& sampling) {
  if (!node.IsMap()) throw ConfigError(path + ": expected a mapping");
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string where = path + "." + key;
    const std::string value = scalar(item.second, where);
    if (key == "every_n_steps") {
      sampling.set_every_n_steps(static_cast<std::uint32_t>(parse_uint(value, where, 1'000'000)));
    } else if (key == "layer_fraction" || key == "overhead_budget") {
      const double fraction = parse_positive(value, where);
      if (fraction > 1.0) throw ConfigError(where + ": must be in (0, 1]");
      if (key == "layer_fraction") {
        sampling.set_layer_fraction(fraction);
      } else {
        sampling.set_overhead_budget(fraction);
      }
    } else if (key == "max_heads") {
      sampling.set_max_heads(static_cast<std::uint32_t>(parse_uint(value, where, 1u << 16)));
    } else if (key == "max_rows") {
      sampling.set_max_rows(static_cast<std::uint32_t>(parse_uint(value, where, 1u << 24)));
    } else {
      throw ConfigError(where + ": unknown key");
    }
  }
}

void parse_limits(const YAML::Node& node, const std::string& path, Limits& limits) {
  if (!node.IsMap()) throw ConfigError(path + ": expected a mapping");
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string where = path + "." + key;
    const auto value = static_cast<std::uint32_t>(
        parse_uint(scalar(item.second, where), where, 1u << 30));
    if (value == 0) throw ConfigError(where + ": must be >= 1");
    if (key == "max_layers") {
      limits.max_layers = value;
    } else if (key == "max_batch_samples") {
      limits.max_batch_samples = value;
    } else if (key == "max_message_bytes") {
      limits.max_message_bytes = value;
    } else if (key == "max_string_bytes") {
      limits.max_string_bytes = value;
    } else if (key == "max_streams") {
      limits.max_streams = value;
    } else if (key == "max_ranks") {
      limits.max_ranks = value;
    } else if (key == "hello_timeout_seconds") {
      limits.hello_timeout_seconds = value;
    } else if (key == "max_clock_skew_seconds") {
      limits.max_clock_skew_seconds = value;
    } else {
      throw ConfigError(where + ": unknown key");
    }
  }
}

// yaml-cpp recurses on flow collections; refuse absurd nesting before parsing.
void check_nesting(std::string_view text) {
  int depth = 0;
  for (char ch : text) {
    if (ch == '[' || ch == '{') {
      if (++depth > kMaxYamlNesting) throw ConfigError("config: nesting deeper than 32 levels");
    } else if ((ch == ']' || ch == '}') && depth > 0) {
      --depth;
    }
  }
}

}  // namespace

std::optional<reference::MetricId> metric_by_name(std::string_view name) {
  for (const auto& spec : reference::metric_catalogue()) {
    if (spec.name == name) return spec.id;
  }
  return std::nullopt;
}

ThresholdRule default_dq_rule() {
  ThresholdRule rule;
  rule.name = "default_dq_discrepancy_gproj";
  rule.metric = reference::MetricId::kLiveDqDiscrepancy;
  rule.op = RuleOp::kGreater;
  rule.threshold = 0.05;
  rule.clear_threshold = 0.025;
  rule.for_samples = 3;
  rule.backend = gaugewatch::v1::BACKEND_GPROJ;
  return rule;
}

std::vector<ThresholdRule> effective_rules(const AgentConfig& config) {
  std::vector<ThresholdRule> rules;
  if (config.default_rules) rules.push_back(default_dq_rule());
  rules.insert(rules.end(), config.rules.begin(), config.rules.end());
  return rules;
}

void apply_yaml(std::string_view yaml_text, AgentConfig& config) {
  if (yaml_text.size() > kMaxYamlBytes) throw ConfigError("config: larger than 1 MiB");
  check_nesting(yaml_text);
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    throw ConfigError(std::string("config: YAML syntax error: ") + e.what());
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw ConfigError("config: top level must be a mapping");
  try {
    for (const auto& item : root) {
      if (!item.first.IsScalar()) throw ConfigError("config: keys must be scalars");
      const std::string key = item.first.Scalar();
      if (key == "rules") {
        if (!item.second.IsSequence()) throw ConfigError("rules: expected a list");
        config.rules.clear();
        for (std::size_t i = 0; i < item.second.size(); ++i) {
          config.rules.push_back(parse_rule(item.second[i], "rules[" + std::to_string(i) + "]"));
        }
      } else if (key == "promql_rules") {
        if (!item.second.IsSequence()) throw ConfigError("promql_rules: expected a list");
        config.promql_rules.clear();
        for (std::size_t i = 0; i < item.second.size(); ++i) {
          config.promql_rules.push_back(
              parse_promql_rule(item.second[i], "promql_rules[" + std::to_string(i) + "]"));
        }
      } else if (key == "sampling") {
        parse_sampling(item.second, "sampling", config.sampling);
      } else if (key == "limits") {
        parse_limits(item.second, "limits", config.limits);
      } else {
        bool known = false;
        for (const auto& option : config_options()) {
          if (option.key == key) {
            option.set(config, scalar(item.second, key), key);
            known = true;
            break;
          }
        }
        if (!known) throw ConfigError(key + ": unknown key");
      }
    }
  } catch (const YAML::Exception& e) {
    throw ConfigError(std::string("config: ") + e.what());
  }
}

void check_config(const AgentConfig& config) {
  if (config.grpc_socket.empty() && config.tcp_listen.empty()) {
    throw ConfigError("grpc_socket and tcp_listen are both empty: nothing to listen on");
  }
  if (!config.tcp_listen.empty()) {
    if (config.tls_cert.empty() || config.tls_key.empty()) {
      throw ConfigError("tcp_listen needs tls_cert and tls_key (TCP is TLS only)");
    }
    if (config.admin_token.empty()) {
      throw ConfigError("tcp_listen needs admin_token_file with a non-empty token (admin calls and hook streams over TCP present it)");
    }
  }
  if (config.trainer_sample_rate > 0.0 && config.trainer_sample_burst < 1.0) {
    throw ConfigError("trainer_sample_burst must be >= 1 when trainer_sample_rate is set");
  }
  if (config.audit_max_age_seconds > 100.0 * 365 * 86400) {
    throw ConfigError("audit_max_age_seconds: more than 100 years (use 0 for no age bound)");
  }
  if (config.retention_interval_seconds > 365.0 * 86400) {
    throw ConfigError("retention_interval_seconds: more than a year");
  }
  if (config.http_listen.empty()) throw ConfigError("http_listen is empty");
  if (config.database.empty()) throw ConfigError("database is empty");
  if (!config.promql_rules.empty() && config.prometheus_url.empty()) {
    throw ConfigError("promql_rules need prometheus_url");
  }
  if (!config.prometheus_url.empty() && config.prometheus_url.rfind("http://", 0) != 0) {
    throw ConfigError("prometheus_url must start with http://");
  }
}

}  // namespace gaugewatch::agent
