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

TEST(AgentConfig, RateLimitAndRetentionFromDefaultsYamlEnvAndFlags) {
  CommandLine cl;
  AgentConfig config = load_config({}, env_of({}), cl);
  // Embedded defaults: the load benchmark's paced runs offer 100k samples/s
  // over 16 or 64 trainers (<= 6.25k per trainer): far under the limit.
  EXPECT_DOUBLE_EQ(config.trainer_sample_rate, 50000.0);
  EXPECT_DOUBLE_EQ(config.trainer_sample_burst, 100000.0);
  EXPECT_EQ(config.audit_max_rows, 1'000'000u);
  EXPECT_DOUBLE_EQ(config.audit_max_age_seconds, 30.0 * 86400.0);
  EXPECT_EQ(config.decision_history, 10'000u);
  EXPECT_DOUBLE_EQ(config.retention_interval_seconds, 300.0);

  apply_yaml(R"(
trainer_sample_rate: 2000
trainer_sample_burst: 500
audit_max_rows: 0
audit_max_age_seconds: 3600
decision_history: 7
retention_interval_seconds: 0.5
)",
             config);
  EXPECT_DOUBLE_EQ(config.trainer_sample_rate, 2000.0);
  EXPECT_DOUBLE_EQ(config.trainer_sample_burst, 500.0);
  EXPECT_EQ(config.audit_max_rows, 0u);
  EXPECT_DOUBLE_EQ(config.audit_max_age_seconds, 3600.0);
  EXPECT_EQ(config.decision_history, 7u);
  EXPECT_DOUBLE_EQ(config.retention_interval_seconds, 0.5);
  EXPECT_NO_THROW(check_config(config));

  config = load_config({"--trainer-sample-rate", "0", "--audit-max-rows=25"},
                       env_of({{"GAUGEWATCH_AGENT_TRAINER_SAMPLE_RATE", "10"},
                               {"GAUGEWATCH_AGENT_DECISION_HISTORY", "3"},
                               {"GAUGEWATCH_AGENT_AUDIT_MAX_AGE_SECONDS", "0"}}),
                       cl);
  EXPECT_DOUBLE_EQ(config.trainer_sample_rate, 0.0);  // flag beats environment
  EXPECT_EQ(config.audit_max_rows, 25u);
  EXPECT_EQ(config.decision_history, 3u);
  EXPECT_DOUBLE_EQ(config.audit_max_age_seconds, 0.0);

  const std::string help = help_text();
  for (const char* flag : {"--trainer-sample-rate", "--trainer-sample-burst", "--audit-max-rows",
                           "--audit-max-age-seconds", "--decision-history",
                           "--retention-interval-seconds", "GAUGEWATCH_AGENT_AUDIT_MAX_ROWS"}) {
    EXPECT_NE(help.find(flag), std::string::npos) << flag;
  }

  AgentConfig bad;
  EXPECT_THROW(apply_yaml("trainer_sample_rate: -1", bad), ConfigError);
  EXPECT_THROW(apply_yaml("audit_max_age_seconds: forever", bad), ConfigError);
  EXPECT_THROW(apply_yaml("retention_interval_seconds: 0", bad), ConfigError);
  EXPECT_THROW(apply_yaml("decision_history: -2", bad), ConfigError);
  bad = AgentConfig{};
  bad.trainer_sample_burst = 0.5;
  EXPECT_THROW(check_config(bad), ConfigError);
  bad.trainer_sample_rate = 0;  // unlimited: the burst does not matter
  EXPECT_NO_THROW(check_config(bad));
  bad.audit_max_age_seconds = 1e300;
  EXPECT_THROW(check_config(bad), ConfigError);
  bad.audit_max_age_seconds = 0;
  bad.retention_interval_seconds = 1e12;
  EXPECT_THROW(check_config(bad), ConfigError);
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
