// gaugewatch-agent: the per-node daemon. Wires the configuration into an
// Agent and waits for SIGTERM or SIGINT, then shuts down cleanly.

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "agent/common/backend_names.h"
#include "agent/common/event_log.h"
#include "agent/config/agent_config.h"
#include "agent/export/metric_catalogue.h"
#include "agent/server/agent.h"

namespace {

std::string describe(const gaugewatch::agent::AgentConfig& config) {
  std::string out = "gaugewatch-agent " + std::string(gaugewatch::agent::kAgentVersion) + "\n";
  out += "  config file: " + (config.config_file.empty() ? "(none, embedded defaults)" : config.config_file) + "\n";
  const auto defaults = gaugewatch::default_paths();
  const auto origin = [&](const std::string& path, const std::string& default_path) {
    return path == default_path ? std::string(" (default for ") + defaults.basis + ")" : std::string();
  };
  out += "  grpc socket: " + config.grpc_socket + origin(config.grpc_socket, defaults.socket) + "\n";
  out += "  tcp:         " + (config.tcp_listen.empty() ? "(off)" : config.tcp_listen) + "\n";
  out += "  http:        " + config.http_listen + "\n";
  out += "  database:    " + config.database + origin(config.database, defaults.database) + "\n";
  out += "  rules:       " + std::to_string(gaugewatch::agent::effective_rules(config).size()) +
         " threshold, " + std::to_string(config.promql_rules.size()) + " PromQL\n";
  const auto num = [](double v) {
    std::string text = std::to_string(v);
    text.erase(text.find_last_not_of('0') + 1);
    if (!text.empty() && text.back() == '.') text.pop_back();
    return text;
  };
  out += "  rate limit:  " +
         (config.trainer_sample_rate > 0
              ? num(config.trainer_sample_rate) + " samples/s per trainer, burst " +
                    num(config.trainer_sample_burst)
              : std::string("(off)")) +
         "\n";
  out += "  retention:   audit " +
         (config.audit_max_rows > 0 ? std::to_string(config.audit_max_rows) + " rows" : std::string("unbounded rows")) +
         ", " + (config.audit_max_age_seconds > 0 ? num(config.audit_max_age_seconds) + " s" : std::string("no age bound")) +
         "; decisions: newest per scope + " + std::to_string(config.decision_history) +
         " superseded; every " + num(config.retention_interval_seconds) + " s\n";
  return out;
}

// The exported metric catalogue as a Markdown table (docs/agent.md).
void print_catalogue() {
  using namespace gaugewatch::agent;
  std::cout << "| name | type | unit | labels | help |\n|---|---|---|---|---|\n";
  for (const auto& m : exported_catalogue()) {
    const char* type = m.type == MetricType::kGauge     ? "gauge"
                       : m.type == MetricType::kCounter ? "counter"
                       : m.type == MetricType::kInfo    ? "info"
                                                        : "histogram";
    std::string help;
    for (char ch : m.help) {
      if (ch == '|') help += '\\';
      help += ch;
    }
    std::cout << "| `" << m.name << "` | " << type << " | " << m.unit << " | " << m.labels << " | " << help
              << " |\n";
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace gaugewatch::agent;
  std::vector<std::string> args(argv + 1, argv + argc);
  CommandLine command_line;
  AgentConfig config;
  try {
    config = load_config(args, [](const char* name) -> const char* { return std::getenv(name); },
                         command_line);
    if (command_line.help) {
      std::cout << help_text();
      return 0;
    }
    if (command_line.version) {
      std::cout << "gaugewatch-agent " << kAgentVersion << "\n";
      return 0;
    }
    if (command_line.print_catalogue) {
      print_catalogue();
      return 0;
    }
    check_config(config);
    if (command_line.check_config) {
      std::cout << describe(config) << "configuration OK\n";
      return 0;
    }
  } catch (const ConfigError& e) {
    std::cerr << "gaugewatch-agent: configuration error: " << e.what() << "\n";
    return 2;
  }

  // Block the signals in every thread; this thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  configure_event_log(config.log_level, config.log_format == "json" ? LogFormat::kJson : LogFormat::kText);
  try {
    Agent agent(config);
    std::cerr << describe(config) << "  http port:   " << agent.http_port() << "\n";
    if (agent.tcp_port() != 0) std::cerr << "  tcp port:    " << agent.tcp_port() << "\n";
    std::cerr << "gaugewatch-agent: ready\n";
    events().info("ready: socket {} http port {} database {}", config.grpc_socket, agent.http_port(),
                  config.database);
    int received = 0;
    sigwait(&signals, &received);
    std::cerr << "gaugewatch-agent: " << (received == SIGTERM ? "SIGTERM" : "SIGINT")
              << ", shutting down\n";
    agent.shutdown();
  } catch (const std::exception& e) {
    std::cerr << "gaugewatch-agent: cannot start: " << e.what() << "\n";
    return 1;
  }
  std::cerr << "gaugewatch-agent: stopped\n";
  return 0;
}
