// Integration tests: a real Agent (gRPC server on a real unix socket or TCP
// with TLS, SQLite file, civetweb HTTP) and real gRPC clients.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "agent/ctl/ctl_commands.h"
#include "agent/export/http_server.h"
#include "agent/server/agent.h"
#include "agent/testing/sim_trainer.h"
#include "gaugewatch/v1/admin_service.grpc.pb.h"
#include "tests/agent/agent_test_calls.h"
#include "tests/agent/agent_test_env.h"
#include "tests/agent/test_certificate.h"

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;

v1::SampleBatch batch_of(std::uint64_t step, std::uint32_t layer, double dq) {
  v1::SampleBatch batch;
  *batch.add_samples() = SimTrainer::make_sample(step, layer, dq);
  return batch;
}

TEST(AgentIntegration, DefaultRuleSwitchesLayerOverUnixSocket) {
  TempDir dir;
  const AgentConfig config = hermetic_config(dir);
  Agent agent(config);
  struct stat st;
  ASSERT_EQ(::stat(config.grpc_socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-a", 0, 2, 4));
  ASSERT_TRUE(trainer.start());
  EXPECT_EQ(trainer.hello_ack().protocol_version(), v1::PROTOCOL_VERSION_1);
  // Layer 1 stays below 5%; layer 2 goes above it: 2 samples are not enough...
  for (std::uint64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(trainer.send_batch(batch_of(step, 2, 0.30)));
    ASSERT_TRUE(trainer.send_batch(batch_of(step, 1, 0.01)));
  }
  EXPECT_TRUE(trainer.wait_commands(1, milliseconds(300)).empty());
  // ...the third consecutive one fires the default rule.
  ASSERT_TRUE(trainer.send_batch(batch_of(3, 2, 0.31)));
  auto commands = trainer.wait_commands(1, seconds(10));
  ASSERT_EQ(commands.size(), 1u);
  ASSERT_TRUE(commands[0].has_switch_backend());
  EXPECT_EQ(commands[0].switch_backend().backend(), v1::BACKEND_GPROJ);
  ASSERT_EQ(commands[0].switch_backend().layers_size(), 1);
  EXPECT_EQ(commands[0].switch_backend().layers(0), 2u);
  EXPECT_NE(commands[0].decision_id(), 0u);
  ASSERT_TRUE(trainer.ack(commands[0].command_id(), true, 4));
  // More bad samples of the same layer do not fire again (already desired).
  for (std::uint64_t step = 4; step <= 7; ++step) {
    auto batch = batch_of(step, 2, 0.3);
    batch.mutable_samples(0)->set_backend(v1::BACKEND_GPROJ);
    ASSERT_TRUE(trainer.send_batch(batch));
  }

  auto admin = v1::AdminService::NewStub(unix_channel(config));
  ASSERT_TRUE(eventually([&] {
    auto runs = list_runs(*admin, "run-a");
    return runs.runs_size() == 1 && runs.runs(0).ranks(0).layers(2).samples() == 7;
  }));
  const auto runs = list_runs(*admin, "run-a");
  const auto& layer2 = runs.runs(0).ranks(0).layers(2);
  EXPECT_EQ(layer2.desired_backend(), v1::BACKEND_GPROJ);
  EXPECT_DOUBLE_EQ(layer2.latest().live_dq_discrepancy(), 0.3);
  EXPECT_EQ(runs.runs(0).ranks(0).layers(1).desired_backend(), v1::BACKEND_UNSPECIFIED);
  EXPECT_EQ(trainer.wait_commands(2, milliseconds(200)).size(), 1u);

  grpc::ClientContext context;
  v1::ListDecisionsRequest request;
  request.set_include_audit(true);
  v1::ListDecisionsResponse history;
  ASSERT_TRUE(admin->ListDecisions(&context, request, &history).ok());
  ASSERT_EQ(history.decisions_size(), 1);
  EXPECT_EQ(history.decisions(0).source(), v1::DECISION_SOURCE_RULE);
  EXPECT_EQ(history.decisions(0).rule(), "default_dq_discrepancy_gproj");
  bool acked = false;
  for (const auto& record : history.audit()) {
    acked |= record.kind() == v1::AUDIT_KIND_COMMAND_ACKED &&
             record.command_id() == commands[0].command_id();
  }
  EXPECT_TRUE(acked);

  const std::string text = scrape(agent);
  EXPECT_NE(text.find("gaugewatch_layer_live_dq_discrepancy_ratio{run=\"run-a\",rank=\"0\",layer=\"2\"} 0.3\n"),
            std::string::npos);
  EXPECT_NE(text.find("backend=\"gproj\",desired=\"gproj\""), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_decisions_total{source=\"rule\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_command_acks_total{status=\"applied\"} 1\n"), std::string::npos);
  EXPECT_TRUE(trainer.finish().ok());
}

TEST(AgentIntegration, ManyConcurrentTrainers) {
  TempDir dir;
  AgentConfig config = hermetic_config(dir);
  config.default_rules = false;
  Agent agent(config);
  constexpr std::uint32_t kTrainers = 24;
  constexpr std::uint32_t kLayers = 8;
  constexpr int kBatches = 40;
  std::vector<std::unique_ptr<SimTrainer>> trainers;
  for (std::uint32_t r = 0; r < kTrainers; ++r) {
    trainers.push_back(std::make_unique<SimTrainer>(
        unix_channel(config), SimTrainer::make_hello(r % 2 ? "run-odd" : "run-even", r, kTrainers, kLayers)));
    ASSERT_TRUE(trainers.back()->start());
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (std::uint32_t r = 0; r < kTrainers; ++r) {
    threads.emplace_back([&, r] {
      for (int b = 0; b < kBatches; ++b) {
        v1::SampleBatch batch;
        for (std::uint32_t l = 0; l < kLayers; ++l) {
          *batch.add_samples() = SimTrainer::make_sample(static_cast<std::uint64_t>(b), l, 0.01 * r);
        }
        if (!trainers[r]->send_batch(batch)) failures++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const std::uint64_t expected = std::uint64_t{kTrainers} * kBatches * kLayers;
  ASSERT_TRUE(eventually(
      [&] { return agent.controller().counters().samples_received_total.Value() == expected; }));

  // One all-runs decision reaches every trainer exactly once.
  auto admin = v1::AdminService::NewStub(unix_channel(config));
  grpc::ClientContext context;
  v1::SetBackendRequest request;
  request.mutable_target()->set_all_runs(true);
  request.mutable_target()->add_layers(5);
  request.set_backend(v1::BACKEND_PIVOT);
  v1::SetBackendResponse response;
  ASSERT_TRUE(admin->SetBackend(&context, request, &response).ok());
  EXPECT_EQ(response.commands_sent(), kTrainers);
  for (auto& trainer : trainers) {
    auto commands = trainer->wait_commands(1, seconds(10));
    ASSERT_EQ(commands.size(), 1u);
    EXPECT_EQ(commands[0].switch_backend().backend(), v1::BACKEND_PIVOT);
    EXPECT_EQ(commands[0].switch_backend().layers(0), 5u);
  }
  const auto runs = list_runs(*admin, "");
  ASSERT_EQ(runs.runs_size(), 2);
  EXPECT_EQ(runs.runs(0).ranks_size() + runs.runs(1).ranks_size(), static_cast<int>(kTrainers));
  const std::string text = scrape(agent);
  EXPECT_NE(text.find("gaugewatch_agent_trainers_connected 24\n"), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_samples_received_total " + std::to_string(expected) + "\n"),
            std::string::npos);
  for (auto& trainer : trainers) EXPECT_TRUE(trainer->finish().ok());
  EXPECT_TRUE(eventually([&] { return agent.controller().counters().trainers_connected.Value() == 0; }));
}

TEST(AgentIntegration, RestartRestoresDecisionsAndResendsThem) {
  TempDir dir;
  const AgentConfig config = hermetic_config(dir);
  std::uint64_t decision_id = 0;
  {
    Agent agent(config);
    // The run must be known to the agent: its rank 1 connected once and left.
    SimTrainer earlier(unix_channel(config), SimTrainer::make_hello("run-r", 1, 2, 4));
    ASSERT_TRUE(earlier.start());
    EXPECT_TRUE(earlier.finish().ok());
    ASSERT_TRUE(eventually([&] { return agent.controller().counters().trainers_connected.Value() == 0; }));
    auto admin = v1::AdminService::NewStub(unix_channel(config));
    grpc::ClientContext context;
    v1::SetBackendRequest request;
    request.mutable_target()->set_run_id("run-r");
    request.mutable_target()->set_rank(1);
    request.mutable_target()->add_layers(3);
    request.set_backend(v1::BACKEND_FP32);
    request.set_reason("operator test");
    v1::SetBackendResponse response;
    ASSERT_TRUE(admin->SetBackend(&context, request, &response).ok());
    decision_id = response.decision_id();
    EXPECT_EQ(response.commands_sent(), 0u);  // nobody connected now
    agent.shutdown();
  }
  Agent agent(config);  // same database
  // A rank the decision does not cover gets nothing.
  SimTrainer other(unix_channel(config), SimTrainer::make_hello("run-r", 0, 2, 4));
  ASSERT_TRUE(other.start());
  SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-r", 1, 2, 4));
  ASSERT_TRUE(trainer.start());
  auto commands = trainer.wait_commands(1, seconds(10));
  ASSERT_EQ(commands.size(), 1u);
  EXPECT_EQ(commands[0].decision_id(), decision_id);
  EXPECT_EQ(commands[0].switch_backend().backend(), v1::BACKEND_FP32);
  EXPECT_EQ(commands[0].switch_backend().layers(0), 3u);
  EXPECT_EQ(commands[0].reason(), "restored decision on reconnect");
  EXPECT_TRUE(other.wait_commands(1, milliseconds(300)).empty());

  // Reconnecting again re-sends again (the trainer still reports stock).
  EXPECT_TRUE(trainer.finish().ok());
  SimTrainer again(unix_channel(config), SimTrainer::make_hello("run-r", 1, 2, 4));
  ASSERT_TRUE(again.start());
  EXPECT_EQ(again.wait_commands(1, seconds(10)).size(), 1u);
  // Command ids keep increasing across restarts.
  EXPECT_GT(again.commands()[0].command_id(), commands[0].command_id());
  std::ostringstream out, err;
  const std::vector<std::string> args = {"history", "--socket", config.grpc_socket, "--audit"};
  ASSERT_EQ(run_ctl(args, out, err, [](const char*) -> const char* { return nullptr; }), 0) << err.str();
  EXPECT_NE(out.str().find("run run-r rank 1 layers 3"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("command_sent"), std::string::npos);
}

TEST(AgentIntegration, BadInputIsRejectedAndCountedOthersUnaffected) {
  TempDir dir;
  const AgentConfig config = hermetic_config(dir);
  Agent agent(config);
  SimTrainer good(unix_channel(config), SimTrainer::make_hello("run-good", 0, 1, 2));
  ASSERT_TRUE(good.start());

  {  // samples before hello
    grpc::ClientContext context;
    auto stub = v1::HookService::NewStub(unix_channel(config));
    auto stream = stub->Connect(&context);
    v1::TrainerMessage message;
    *message.mutable_samples() = batch_of(1, 0, 0.1);
    stream->Write(message);
    const auto status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("samples before hello"), std::string::npos);
  }
  {  // wrong protocol version
    auto hello = SimTrainer::make_hello("run-bad", 0, 1, 2);
    hello.set_protocol_version(static_cast<v1::ProtocolVersion>(7));
    SimTrainer bad(unix_channel(config), hello);
    EXPECT_FALSE(bad.start(seconds(5)));
    EXPECT_EQ(bad.wait_end(seconds(5)).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  {  // NaN metric and out-of-range layer
    SimTrainer bad(unix_channel(config), SimTrainer::make_hello("run-bad", 0, 1, 2));
    ASSERT_TRUE(bad.start());
    auto batch = batch_of(1, 0, 0.1);
    batch.mutable_samples(0)->mutable_metrics()->set_key_rms(std::nan(""));
    bad.send_batch(batch);
    const auto status = bad.wait_end(seconds(5));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("key_rms"), std::string::npos) << status.error_message();
  }
  {
    SimTrainer bad(unix_channel(config), SimTrainer::make_hello("run-bad", 0, 1, 2));
    ASSERT_TRUE(bad.start());
    bad.send_batch(batch_of(1, 9, 0.1));
    const auto status = bad.wait_end(seconds(5));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("layer 9 out of range"), std::string::npos);
  }
  {  // a message over the size limit never reaches the handler
    SimTrainer bad(unix_channel(config), SimTrainer::make_hello("run-bad", 0, 1, 2));
    ASSERT_TRUE(bad.start());
    auto batch = batch_of(1, 0, 0.1);
    batch.mutable_samples(0)->mutable_shape()->set_dtype(std::string(5u << 20, 'x'));
    bad.send_batch(batch);
    EXPECT_EQ(bad.wait_end(seconds(5)).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  // The good trainer is unaffected.
  ASSERT_TRUE(good.send_batch(batch_of(1, 1, 0.01)));
  ASSERT_TRUE(eventually([&] { return agent.controller().counters().samples_received_total.Value() == 1; }));
  const std::string text = scrape(agent);
  EXPECT_NE(text.find("gaugewatch_agent_messages_rejected_total{reason=\"out_of_order\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_messages_rejected_total{reason=\"protocol_version\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_messages_rejected_total{reason=\"metric\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_messages_rejected_total{reason=\"layer_index\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_samples_rejected_total 3\n"), std::string::npos);
  EXPECT_TRUE(good.finish().ok());

  // Bad admin input.
  auto admin = v1::AdminService::NewStub(unix_channel(config));
  grpc::ClientContext context;
  v1::SetBackendRequest request;
  request.mutable_target()->set_run_id("bad run id");
  request.set_backend(v1::BACKEND_GPROJ);
  v1::SetBackendResponse response;
  EXPECT_EQ(admin->SetBackend(&context, request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(AgentIntegration, SilentRanksExpireAndAreExported) {
  TempDir dir;
  AgentConfig config = hermetic_config(dir);
  config.rank_expiry_seconds = 0.3;
  Agent agent(config);
  SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-e", 0, 1, 2));
  ASSERT_TRUE(trainer.start());
  ASSERT_TRUE(trainer.send_batch(batch_of(1, 0, 0.01)));
  ASSERT_TRUE(eventually([&] { return scrape(agent).find("layer=\"0\"") != std::string::npos; }));
  EXPECT_TRUE(trainer.finish().ok());
  ASSERT_TRUE(eventually([&] {
    return scrape(agent).find("gaugewatch_rank_expired{run=\"run-e\",rank=\"0\"} 1\n") != std::string::npos;
  }));
  const std::string text = scrape(agent);
  EXPECT_EQ(text.find("gaugewatch_layer_live_dq_discrepancy_ratio{run=\"run-e\""), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_ranks_expired_total 1\n"), std::string::npos);
  // Only the expired rank's own series remain.
  EXPECT_NE(text.find("gaugewatch_agent_series " + std::to_string(RunRegistry::kSeriesPerRank) + "\n"),
            std::string::npos);
}

// --- TCP with TLS and a bearer token -----------------------------------------

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TEST(AgentIntegration, TcpTlsAdminWithoutTokenIsRefused) {
  TempDir dir;
  ASSERT_TRUE(write_self_signed_certificate(dir.path() + "/cert.pem", dir.path() + "/key.pem"));
  { std::ofstream(dir.path() + "/token") << "s3cret-token\n"; }
  CommandLine cl;
  AgentConfig config = load_config(
      {"--grpc-socket", dir.path() + "/agent.sock", "--http-listen", "127.0.0.1:0", "--database",
       dir.path() + "/agent.db", "--tcp-listen", "127.0.0.1:0", "--tls-cert",
       dir.path() + "/cert.pem", "--tls-key", dir.path() + "/key.pem", "--admin-token-file",
       dir.path() + "/token"},
      [](const char*) -> const char* { return nullptr; }, cl);
  Agent agent(config);
  ASSERT_GT(agent.tcp_port(), 0);
  const std::string address = "127.0.0.1:" + std::to_string(agent.tcp_port());
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = slurp(dir.path() + "/cert.pem");
  auto channel = grpc::CreateChannel(address, grpc::SslCredentials(ssl));
  auto admin = v1::AdminService::NewStub(channel);
  {
    grpc::ClientContext context;
    v1::GetStatusResponse response;
    const auto status = admin->GetStatus(&context, {}, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer wrong");
    v1::SetBackendRequest request;
    request.mutable_target()->set_all_runs(true);
    request.set_backend(v1::BACKEND_GPROJ);
    v1::SetBackendResponse response;
    EXPECT_EQ(admin->SetBackend(&context, request, &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer s3cret-token");
    v1::GetStatusResponse response;
    EXPECT_TRUE(admin->GetStatus(&context, {}, &response).ok());
    EXPECT_EQ(response.agent_version(), "0.1.0");
  }
  // A trainer over TCP + TLS presents the same bearer token.
  SimTrainer trainer(channel, SimTrainer::make_hello("run-tcp", 0, 1, 2), "s3cret-token");
  ASSERT_TRUE(trainer.start());
  ASSERT_TRUE(trainer.send_batch(batch_of(1, 0, 0.01)));
  EXPECT_TRUE(trainer.finish().ok());
  // The CLI: refused without a token, accepted with it.
  auto no_env = [](const char*) -> const char* { return nullptr; };
  std::ostringstream out, err;
  EXPECT_EQ(run_ctl({"status", "--address", address, "--tls-ca", dir.path() + "/cert.pem"}, out, err, no_env),
            kCtlRpcError);
  EXPECT_NE(err.str().find("authorization"), std::string::npos) << err.str();
  std::ostringstream out2, err2;
  EXPECT_EQ(run_ctl({"status", "--json", "--address", address, "--tls-ca", dir.path() + "/cert.pem",
                     "--token-file", dir.path() + "/token"},
                    out2, err2, no_env),
            kCtlOk)
      << err2.str();
  EXPECT_NE(out2.str().find("\"agent_version\": \"0.1.0\""), std::string::npos) << out2.str();
}

// Hook streams over TCP need the admin bearer token; over the unix socket of
// the same agent they do not.
TEST(AgentIntegration, TcpHookStreamWithoutTokenIsRefused) {
  TempDir dir;
  ASSERT_TRUE(write_self_signed_certificate(dir.path() + "/cert.pem", dir.path() + "/key.pem"));
  AgentConfig config = hermetic_config(dir);
  config.tcp_listen = "127.0.0.1:0";
  config.tls_cert = dir.path() + "/cert.pem";
  config.tls_key = dir.path() + "/key.pem";
  config.admin_token = "hook-token-42";
  Agent agent(config);
  ASSERT_GT(agent.tcp_port(), 0);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = slurp(dir.path() + "/cert.pem");
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(agent.tcp_port()),
                                     grpc::SslCredentials(ssl));

  for (const std::string& token : {std::string(), std::string("wrong-token")}) {
    SimTrainer intruder(channel, SimTrainer::make_hello("run-x", 0, 1, 2), token);
    EXPECT_FALSE(intruder.start(seconds(10))) << "token '" << token << "'";
    const grpc::Status status = intruder.wait_end(seconds(10));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << "token '" << token << "': " << status.error_message();
    if (token.empty()) {
      EXPECT_NE(status.error_message().find("authorization: Bearer"), std::string::npos)
          << status.error_message();
    }
  }
  // Nothing of the refused streams reached the state.
  auto admin = v1::AdminService::NewStub(unix_channel(config));
  EXPECT_EQ(list_runs(*admin, "run-x").runs_size(), 0);
  EXPECT_NE(scrape(agent).find("gaugewatch_agent_hook_streams_unauthenticated_total 2\n"),
            std::string::npos);
  EXPECT_NE(scrape(agent).find("gaugewatch_agent_connections_total 0\n"), std::string::npos);

  // With the token over TCP, and without one over the unix socket: accepted.
  SimTrainer tcp_trainer(channel, SimTrainer::make_hello("run-x", 0, 2, 2), "hook-token-42");
  ASSERT_TRUE(tcp_trainer.start());
  ASSERT_TRUE(tcp_trainer.send_batch(batch_of(1, 0, 0.01)));
  SimTrainer unix_trainer(unix_channel(config), SimTrainer::make_hello("run-x", 1, 2, 2));
  ASSERT_TRUE(unix_trainer.start());
  ASSERT_TRUE(unix_trainer.send_batch(batch_of(1, 1, 0.01)));
  ASSERT_TRUE(eventually([&] {
    auto runs = list_runs(*admin, "run-x");
    return runs.runs_size() == 1 && runs.runs(0).ranks_size() == 2 &&
           runs.runs(0).ranks(0).layers(0).samples() == 1 &&
           runs.runs(0).ranks(1).layers(1).samples() == 1;
  }));
  EXPECT_TRUE(tcp_trainer.finish().ok());
  EXPECT_TRUE(unix_trainer.finish().ok());
}

TEST(AgentIntegration, SamplingCaptureCommandsAndCaptureRule) {
  TempDir dir;
  AgentConfig config = hermetic_config(dir);
  config.sampling.set_every_n_steps(7);
  ThresholdRule capture;
  capture.name = "capture_sharp";
  capture.metric = reference::MetricId::kSharpRowFraction;
  capture.threshold = 0.5;
  capture.clear_threshold = 0.5;
  capture.for_samples = 2;
  capture.capture_count = 3;
  config.rules.push_back(capture);
  Agent agent(config);
  SimTrainer a(unix_channel(config), SimTrainer::make_hello("run-s", 0, 2, 4));
  SimTrainer b(unix_channel(config), SimTrainer::make_hello("run-s", 1, 2, 2));
  ASSERT_TRUE(a.start());
  ASSERT_TRUE(b.start());
  EXPECT_EQ(a.hello_ack().sampling().every_n_steps(), 7u);

  auto no_env = [](const char*) -> const char* { return nullptr; };
  std::ostringstream out, err;
  ASSERT_EQ(run_ctl({"sampling", "--socket", config.grpc_socket, "--run", "run-s", "--every", "20",
                     "--layer-fraction", "0.5"},
                    out, err, no_env),
            kCtlOk)
      << err.str();
  EXPECT_NE(out.str().find("sent to 2 connected"), std::string::npos) << out.str();
  // Layer 3 exists only on rank 0.
  std::ostringstream out2;
  ASSERT_EQ(run_ctl({"capture", "--socket", config.grpc_socket, "--run", "run-s", "--layer", "3",
                     "--count", "2"},
                    out2, err, no_env),
            kCtlOk)
      << err.str();
  EXPECT_NE(out2.str().find("sent to 1 connected"), std::string::npos) << out2.str();
  EXPECT_EQ(run_ctl({"sampling", "--socket", config.grpc_socket, "--run", "run-s"}, out, err, no_env),
            kCtlUsage);

  auto commands = a.wait_commands(2, seconds(10));
  ASSERT_EQ(commands.size(), 2u);
  EXPECT_EQ(commands[0].set_sampling().every_n_steps(), 20u);
  EXPECT_DOUBLE_EQ(commands[0].set_sampling().layer_fraction(), 0.5);
  EXPECT_EQ(commands[1].capture().layer(), 3u);
  EXPECT_EQ(commands[1].capture().count(), 2u);
  ASSERT_EQ(b.wait_commands(1, seconds(10)).size(), 1u);
  EXPECT_EQ(b.wait_commands(2, milliseconds(300)).size(), 1u);

  // The capture rule: two sharp samples of layer 1 on rank 1.
  for (std::uint64_t step = 1; step <= 2; ++step) {
    auto batch = batch_of(step, 1, 0.01);
    batch.mutable_samples(0)->mutable_metrics()->set_sharp_row_fraction(0.9);
    ASSERT_TRUE(b.send_batch(batch));
  }
  auto rule_commands = b.wait_commands(2, seconds(10));
  ASSERT_EQ(rule_commands.size(), 2u);
  EXPECT_EQ(rule_commands[1].capture().layer(), 1u);
  EXPECT_EQ(rule_commands[1].capture().count(), 3u);
  EXPECT_EQ(rule_commands[1].reason(), "capture_sharp");
  EXPECT_TRUE(a.finish().ok());
  EXPECT_TRUE(b.finish().ok());
}

TEST(AgentIntegration, CtlUsageErrors) {
  auto no_env = [](const char*) -> const char* { return nullptr; };
  std::ostringstream out, err;
  EXPECT_EQ(run_ctl({}, out, err, no_env), kCtlUsage);
  EXPECT_EQ(run_ctl({"switch", "--run", "r", "--backend", "bogus"}, out, err, no_env), kCtlUsage);
  EXPECT_EQ(run_ctl({"switch", "--run", "r", "--all-runs", "--backend", "gproj"}, out, err, no_env), kCtlUsage);
  EXPECT_EQ(run_ctl({"frobnicate"}, out, err, no_env), kCtlUsage);
  EXPECT_NE(err.str().find("unknown command 'frobnicate'"), std::string::npos);
  TempDir dir;
  std::ostringstream err2;
  EXPECT_EQ(run_ctl({"status", "--socket", dir.path() + "/none.sock", "--timeout", "2"}, out, err2, no_env),
            kCtlRpcError);
  EXPECT_NE(err2.str().find("is gaugewatch-agent running"), std::string::npos) << err2.str();
}

}  // namespace
}  // namespace gaugewatch::agent
