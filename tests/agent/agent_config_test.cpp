#include "agent/config/agent_config.h"

#include <gtest/gtest.h>

#include <map>

namespace gaugewatch::agent {
namespace {

std::function<const char*(const char*)> env_of(const std::map<std::string, std::string>& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(AgentConfig, EmbeddedDefaultsNeedNoFile) {
  CommandLine cl;
  const AgentConfig config = load_config({}, env_of({}), cl);
  EXPECT_EQ(config.grpc_socket, "/run/gaugewatch/agent.sock");
  EXPECT_EQ(config.socket_mode, 0660u);
  EXPECT_TRUE(config.tcp_listen.empty());
  EXPECT_NO_THROW(check_config(config));
  const auto rules = effective_rules(config);
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_EQ(rules[0].metric, reference::MetricId::kLiveDqDiscrepancy);
  EXPECT_DOUBLE_EQ(rules[0].threshold, 0.05);
  EXPECT_EQ(rules[0].for_samples, 3u);
  EXPECT_EQ(rules[0].backend, gaugewatch::v1::BACKEND_GPROJ);
}

TEST(AgentConfig, FlagBeatsEnvironmentBeatsDefault) {
  CommandLine cl;
  auto config = load_config({}, env_of({{"GAUGEWATCH_AGENT_HTTP_LISTEN", "127.0.0.1:1"}}), cl);
  EXPECT_EQ(config.http_listen, "127.0.0.1:1");
  config = load_config({"--http-listen", "127.0.0.1:2"},
                       env_of({{"GAUGEWATCH_AGENT_HTTP_LISTEN", "127.0.0.1:1"}}), cl);
  EXPECT_EQ(config.http_listen, "127.0.0.1:2");
  config = load_config({"--socket-mode=0600"}, env_of({}), cl);
  EXPECT_EQ(config.socket_mode, 0600u);
}

TEST(AgentConfig, HelpListsEveryFlagWithItsVariable) {
  const std::string help = help_text();
  for (const char* flag : {"--grpc-socket", "--socket-mode", "--tcp-listen", "--tls-cert",
                           "--tls-key", "--admin-token-file", "--http-listen", "--database",
                           "--rank-expiry-seconds", "--max-series", "--prometheus-url",
                           "--promql-interval-seconds", "--default-rules", "--config"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }
  EXPECT_NE(help.find("GAUGEWATCH_AGENT_GRPC_SOCKET"), std::string::npos);
  CommandLine cl;
  load_config({"--help"}, env_of({}), cl);
  EXPECT_TRUE(cl.help);
}

TEST(AgentConfig, YamlRulesAndSampling) {
  AgentConfig config;
  apply_yaml(R"(
http_listen: "127.0.0.1:0"
max_series: 1000
rules:
  - name: sharp_capture
    metric: sharp_row_fraction
    op: ">"
    threshold: 0.5
    clear_threshold: 0.4
    for_samples: 2
    layers: [0, 3]
    capture: 1
  - name: run_gproj
    metric: live_gauge_violation
    threshold: 0.1
    switch_backend: pivot
    scope: run
promql_rules:
  - name: fleet
    query: max by (layer) (gaugewatch_layer_live_dq_discrepancy_ratio) > 0.05
    for_polls: 2
sampling:
  every_n_steps: 10
  layer_fraction: 0.5
)",
             config);
  EXPECT_EQ(config.http_listen, "127.0.0.1:0");
  EXPECT_EQ(config.max_series, 1000u);
  ASSERT_EQ(config.rules.size(), 2u);
  EXPECT_EQ(config.rules[0].metric, reference::MetricId::kSharpRowFraction);
  EXPECT_EQ(config.rules[0].layers, (std::vector<std::uint32_t>{0, 3}));
  EXPECT_EQ(config.rules[0].capture_count, 1u);
  EXPECT_EQ(config.rules[1].backend, gaugewatch::v1::BACKEND_PIVOT);
  EXPECT_EQ(config.rules[1].decision_scope, DecisionScope::kRun);
  ASSERT_EQ(config.promql_rules.size(), 1u);
  EXPECT_EQ(config.promql_rules[0].for_polls, 2u);
  EXPECT_EQ(config.sampling.every_n_steps(), 10u);
  EXPECT_EQ(effective_rules(config).size(), 3u);
}

TEST(AgentConfig, ErrorsNameTheKey) {
  AgentConfig config;
  auto message = [&](const std::string& yaml) {
    try {
      apply_yaml(yaml, config);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("bogus: 1").find("bogus: unknown key"), std::string::npos);
  EXPECT_NE(message("max_series: -4").find("max_series"), std::string::npos);
  EXPECT_NE(message("rules: [{name: a, metric: nope, threshold: 1, capture: 1}]")
                .find("unknown metric 'nope'"),
            std::string::npos);
  EXPECT_NE(message("rules: [{name: a, metric: key_rms, threshold: 1, switch_backend: bf17}]")
                .find("unknown backend"),
            std::string::npos);
  EXPECT_NE(message("rules: [{name: a, metric: key_rms, threshold: 1, clear_threshold: 2, "
                    "capture: 1}]")
                .find("clear_threshold"),
            std::string::npos);
  EXPECT_NE(message("key: [unclosed").find("YAML syntax error"), std::string::npos);
  EXPECT_NE(message(std::string(100, '[')).find("nesting"), std::string::npos);
  CommandLine cl;
  EXPECT_THROW(load_config({"--no-such-flag", "1"}, env_of({}), cl), ConfigError);
  EXPECT_THROW(load_config({"--max-series"}, env_of({}), cl), ConfigError);
}

TEST(AgentConfig, TcpNeedsTlsAndToken) {
  AgentConfig config;
  config.tcp_listen = "127.0.0.1:0";
  EXPECT_THROW(check_config(config), ConfigError);
  config.tls_cert = "c";
  config.tls_key = "k";
  EXPECT_THROW(check_config(config), ConfigError);
  config.admin_token = "t";
  EXPECT_NO_THROW(check_config(config));
}

}  // namespace
}  // namespace gaugewatch::agent
