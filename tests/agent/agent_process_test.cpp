// The real binaries: gaugewatch-agent started as a process (no config file),
// gaugewatchctl against it, promtool on its /metrics, SIGTERM shutdown; and a
// real Prometheus server scraping an agent and feeding another agent's
// PromQL rule.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "agent/export/http_server.h"
#include "agent/rules/promql_poller.h"
#include "agent/server/agent.h"
#include "agent/testing/sim_trainer.h"
#include "gaugewatch/v1/admin_service.grpc.pb.h"
#include "tests/agent/agent_test_env.h"
#include "tests/agent/subprocess.h"

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr const char* kPromtool = "/usr/bin/promtool";
constexpr const char* kPrometheus = "/usr/bin/prometheus";

std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

std::vector<std::string> agent_argv(const TempDir& dir, const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {GAUGEWATCH_AGENT_BIN, "--grpc-socket", dir.path() + "/agent.sock",
                                   "--http-listen", "127.0.0.1:0", "--database", dir.path() + "/agent.db"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

// The gaugewatch-agent binary on a socket and database in `dir`, HTTP on a
// free port, `extra` flags after those; its log in dir/agent.log.
struct AgentBinary : Subprocess {
  explicit AgentBinary(const TempDir& dir, const std::vector<std::string>& extra = {})
      : Subprocess(agent_argv(dir, extra), dir.path() + "/agent.log"), socket(dir.path() + "/agent.sock") {}

  // Whether it logged that it is ready within 20 s.
  bool ready() {
    return eventually([&] { return log().find("ready") != std::string::npos; }, seconds(20));
  }

  // A trainer's channel to its socket.
  std::shared_ptr<grpc::Channel> channel() const {
    return grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  }

  const std::string socket;
};

TEST(AgentProcess, RunsWithoutConfigServesCtlPromtoolAndStopsOnSigterm) {
  TempDir dir;
  AgentBinary agent(dir);
  const std::string& socket = agent.socket;
  ASSERT_TRUE(agent.started());
  ASSERT_TRUE(agent.ready()) << agent.log();
  std::smatch match;
  const std::string log = agent.log();
  ASSERT_TRUE(std::regex_search(log, match, std::regex("http port: +([0-9]+)")));
  const auto port = static_cast<std::uint16_t>(std::stoi(match[1]));

  // A trainer streams a few samples so /metrics has layer series.
  SimTrainer trainer(agent.channel(), SimTrainer::make_hello("run-proc", 0, 1, 3));
  ASSERT_TRUE(trainer.start());
  v1::SampleBatch batch;
  for (std::uint32_t l = 0; l < 3; ++l) *batch.add_samples() = SimTrainer::make_sample(1, l, 0.01);
  ASSERT_TRUE(trainer.send_batch(batch));

  const std::string ctl = std::string(GAUGEWATCH_CTL_BIN) + " --socket " + socket;
  ASSERT_TRUE(eventually([&] {
    return run_command(ctl + " layers --run run-proc").second.find("model.layers.2") != std::string::npos;
  }));
  auto [rc, out] = run_command(ctl + " status");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ranks connected   1"), std::string::npos) << out;
  std::tie(rc, out) = run_command(ctl + " switch --run run-proc --layers 1 --backend pivot --json");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"commands_sent\": 1"), std::string::npos) << out;
  EXPECT_EQ(trainer.wait_commands(1, seconds(10)).size(), 1u);
  std::tie(rc, out) = run_command(ctl + " history --json");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("DECISION_SOURCE_ADMIN"), std::string::npos) << out;
  std::tie(rc, out) = run_command(ctl + " switch --all-runs --backend nonsense");
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("gaugewatchctl: switch needs --backend"), std::string::npos) << out;

  const std::string metrics = http_get("127.0.0.1", port, "/metrics").body;
  EXPECT_NE(metrics.find("gaugewatch_layer_key_rms{run=\"run-proc\",rank=\"0\",layer=\"2\"}"),
            std::string::npos);
  if (have_binary(kPromtool)) {
    const std::string file = write_file(dir.path() + "/metrics.txt", metrics);
    std::tie(rc, out) = run_command(std::string(kPromtool) + " check metrics < " + file);
    // Exit 3 means lint findings only (parse errors exit 1). The one finding
    // allowed: docs/numerics.md's "gauge violation" (gauge invariance) contains
    // the word gauge, which promtool's naming lint flags; every other
    // finding fails the test.
    EXPECT_TRUE(rc == 0 || rc == 3) << "promtool check metrics:\n" << out;
    std::istringstream lines(out);
    std::string line;
    const std::regex allowed(
        "gaugewatch_layer_(live|gproj)_gauge_violation_ratio metric name should not include type 'gauge'");
    while (std::getline(lines, line)) {
      if (line.empty()) continue;
      EXPECT_TRUE(std::regex_match(line, allowed)) << "promtool: " << line;
    }
  } else {
    std::cout << "promtool not installed at " << kPromtool << ": skipping promtool check metrics\n";
  }
  EXPECT_EQ(http_get("127.0.0.1", port, "/healthz").status, 200);
  EXPECT_TRUE(trainer.finish().ok());

  const auto code = agent.stop(SIGTERM, seconds(10));
  ASSERT_TRUE(code.has_value()) << "agent did not exit within 10 s of SIGTERM";
  EXPECT_EQ(*code, 0) << agent.log();
  EXPECT_NE(agent.log().find("stopped"), std::string::npos);
  struct stat st;
  EXPECT_NE(::stat(socket.c_str(), &st), 0) << "socket left behind";
}

TEST(AgentProcess, SigtermWithTrainersConnectedEndsTheirStreams) {
  TempDir dir;
  AgentBinary agent(dir);
  ASSERT_TRUE(agent.ready()) << agent.log();
  SimTrainer trainer(agent.channel(), SimTrainer::make_hello("run-term", 0, 1, 2));
  ASSERT_TRUE(trainer.start());
  v1::SampleBatch batch;
  *batch.add_samples() = SimTrainer::make_sample(1, 0, 0.01);
  ASSERT_TRUE(trainer.send_batch(batch));
  const auto code = agent.stop(SIGTERM, seconds(15));
  ASSERT_TRUE(code.has_value()) << "agent did not exit within 15 s of SIGTERM with a trainer connected";
  EXPECT_EQ(*code, 0) << agent.log();
  // The trainer sees its stream end (and would reconnect with backoff).
  EXPECT_FALSE(trainer.wait_end(seconds(10)).ok());
}

TEST(AgentProcess, MissingSocketDirectoryIsReported) {
  TempDir dir;
  Subprocess agent({GAUGEWATCH_AGENT_BIN, "--grpc-socket", dir.path() + "/no/such/dir/agent.sock",
                    "--http-listen", "127.0.0.1:0", "--database", dir.path() + "/agent.db"},
                   dir.path() + "/agent.log");
  const auto code = agent.wait(seconds(10));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 1);
  EXPECT_NE(agent.log().find("does not exist"), std::string::npos) << agent.log();
}

TEST(AgentProcess, BadConfigurationExitsWithClearMessage) {
  TempDir dir;
  const std::string yaml = write_file(dir.path() + "/bad.yaml", "rules:\n  - name: x\n    metric: nope\n");
  Subprocess agent({GAUGEWATCH_AGENT_BIN, "--config", yaml}, dir.path() + "/agent.log");
  const auto code = agent.wait(seconds(10));
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2);
  EXPECT_NE(agent.log().find("rules[0].metric: unknown metric 'nope'"), std::string::npos) << agent.log();
}

// Queries Prometheus' HTTP API; empty vector on any error.
std::vector<PromqlSeries> query(std::uint16_t port, const std::string& promql) {
  try {
    std::string encoded;
    for (unsigned char ch : promql) {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", ch);
      encoded += std::isalnum(ch) ? std::string(1, static_cast<char>(ch)) : std::string(buf);
    }
    const auto answer = http_get("127.0.0.1", port, "/api/v1/query?query=" + encoded);
    if (answer.status != 200) return {};
    return parse_promql_response(answer.body);
  } catch (const std::exception&) {
    return {};
  }
}

TEST(AgentPrometheus, RealPrometheusScrapesAndDrivesFleetRule) {
  if (!have_binary(kPrometheus)) {
    GTEST_SKIP() << "prometheus not installed at " << kPrometheus << " (apt-get install prometheus)";
  }
  TempDir dir;
  // Agent A: a node whose trainer sees a large dQ discrepancy on layer 1.
  TempDir dir_a;
  AgentConfig config_a = hermetic_config(dir_a);
  config_a.default_rules = false;
  Agent agent_a(config_a);
  SimTrainer trainer_a(unix_channel(config_a), SimTrainer::make_hello("run-fleet", 0, 2, 4));
  ASSERT_TRUE(trainer_a.start());
  v1::SampleBatch batch;
  for (std::uint32_t l = 0; l < 4; ++l) *batch.add_samples() = SimTrainer::make_sample(1, l, l == 1 ? 0.42 : 0.01);
  ASSERT_TRUE(trainer_a.send_batch(batch));

  const std::uint16_t prom_port = free_port();
  const std::string yaml = write_file(
      dir.path() + "/prometheus.yml",
      "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      "scrape_configs:\n  - job_name: gaugewatch\n    static_configs:\n"
      "      - targets: ['127.0.0.1:" + std::to_string(agent_a.http_port()) + "']\n");
  Subprocess prometheus({kPrometheus, "--config.file=" + yaml, "--storage.tsdb.path=" + dir.path() + "/data",
                         "--web.listen-address=127.0.0.1:" + std::to_string(prom_port),
                         "--log.level=warn"},
                        dir.path() + "/prometheus.log");
  ASSERT_TRUE(prometheus.started());

  // Prometheus scraped the agent (text format 0.0.4) and stored the value.
  ASSERT_TRUE(eventually(
      [&] {
        auto result = query(prom_port, "gaugewatch_layer_live_dq_discrepancy_ratio{run=\"run-fleet\",layer=\"1\"}");
        return result.size() == 1 && result[0].value == 0.42;
      },
      seconds(45)))
      << prometheus.log();
  auto up = query(prom_port, "up{job=\"gaugewatch\"}");
  ASSERT_EQ(up.size(), 1u);
  EXPECT_EQ(up[0].value, 1.0);
  EXPECT_EQ(query(prom_port, "gaugewatch_agent_build_info").size(), 1u);

  // Agent B, another node, with a fleet-wide PromQL rule against that server.
  TempDir dir_b;
  AgentConfig config_b = hermetic_config(dir_b);
  config_b.default_rules = false;
  config_b.prometheus_url = "http://127.0.0.1:" + std::to_string(prom_port);
  config_b.promql_interval_seconds = 0.5;
  config_b.promql_rules.push_back(
      {"fleet_dq", "max by (layer) (gaugewatch_layer_live_dq_discrepancy_ratio) > 0.05",
       v1::BACKEND_GPROJ, 2});
  Agent agent_b(config_b);
  SimTrainer trainer_b(unix_channel(config_b), SimTrainer::make_hello("run-other", 3, 4, 4));
  ASSERT_TRUE(trainer_b.start());
  auto commands = trainer_b.wait_commands(1, seconds(20));
  ASSERT_EQ(commands.size(), 1u);
  EXPECT_EQ(commands[0].switch_backend().backend(), v1::BACKEND_GPROJ);
  ASSERT_EQ(commands[0].switch_backend().layers_size(), 1);
  EXPECT_EQ(commands[0].switch_backend().layers(0), 1u);
  EXPECT_EQ(trainer_b.wait_commands(2, milliseconds(1500)).size(), 1u) << "rule fired twice";
  auto admin = v1::AdminService::NewStub(unix_channel(config_b));
  grpc::ClientContext context;
  v1::ListDecisionsResponse history;
  ASSERT_TRUE(admin->ListDecisions(&context, {}, &history).ok());
  ASSERT_EQ(history.decisions_size(), 1);
  EXPECT_EQ(history.decisions(0).source(), v1::DECISION_SOURCE_PROMQL_RULE);
  EXPECT_TRUE(history.decisions(0).target().all_runs());
  EXPECT_GE(agent_b.controller().counters().promql_queries_total.Value(), 2u);

  EXPECT_TRUE(trainer_a.finish().ok());
  EXPECT_TRUE(trainer_b.finish().ok());
  const auto code = prometheus.stop(SIGTERM, seconds(15));
  EXPECT_TRUE(code.has_value());
}

}  // namespace
}  // namespace gaugewatch::agent

namespace gaugewatch::agent {
namespace {

// An operator follows an incident through the log alone: the connection,
// the rule firing, the decision, the command and its ack, the disconnection,
// each a JSON object per line with --log-format json.
TEST(AgentProcess, EventLogFollowsAnIncidentAsJson) {
  TempDir dir;
  AgentBinary agent(dir, {"--log-format", "json"});
  ASSERT_TRUE(agent.started());
  ASSERT_TRUE(agent.ready()) << agent.log();
  {
    SimTrainer trainer(agent.channel(), SimTrainer::make_hello("run-log", 0, 1, 2));
    ASSERT_TRUE(trainer.start());
    for (std::uint64_t step = 1; step <= 3; ++step) {
      v1::SampleBatch batch;
      *batch.add_samples() = SimTrainer::make_sample(step, 1, 0.4);
      ASSERT_TRUE(trainer.send_batch(batch));
    }
    const auto commands = trainer.wait_commands(1, seconds(10));
    ASSERT_EQ(commands.size(), 1u);
    ASSERT_TRUE(trainer.ack(commands[0].command_id(), true, 4));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(trainer.finish().ok());
  }
  ASSERT_TRUE(eventually([&] { return agent.log().find("trainer disconnected") != std::string::npos; }))
      << agent.log();
  const std::regex json_line(
      R"(\{"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z","level":"[a-z]+","logger":"gaugewatch-agent","msg":"([^"\\]|\\.)*"\})");
  std::istringstream lines(agent.log());
  std::string line;
  std::size_t events = 0;
  std::string all;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    ++events;
    EXPECT_TRUE(std::regex_match(line, json_line)) << line;
    all += line + "\n";
  }
  EXPECT_GE(events, 6u);
  for (const char* what : {"trainer connected: run=run-log rank=0", "rule fired: run=run-log rank=0 layer=1",
                           "decision 1:", "command sent: run=run-log", "command applied: run=run-log",
                           "trainer disconnected: run=run-log"}) {
    EXPECT_NE(all.find(what), std::string::npos) << what << "\n" << all;
  }
  agent.stop(SIGTERM, seconds(10));
}

}  // namespace
}  // namespace gaugewatch::agent
