// Operational limits of a real Agent (gRPC over a real unix socket, a real
// SQLite file in a temp dir, real HTTP scrapes): per-trainer rate limiting of
// incoming samples, and retention of the audit log and decision history
// (enforced by the agent's own housekeeping thread, surviving a restart).

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <optional>
#include <sstream>
#include <chrono>
#include <string>
#include <thread>

#include "agent/ctl/ctl_commands.h"
#include "agent/export/http_server.h"
#include "agent/server/agent.h"
#include "agent/testing/sim_trainer.h"
#include "gaugewatch/v1/admin_service.grpc.pb.h"
#include "tests/agent/agent_test_calls.h"
#include "tests/agent/agent_test_env.h"

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::uint64_t rank_samples(v1::AdminService::Stub& admin, const std::string& run) {
  const auto runs = list_runs(admin, run);
  if (runs.runs_size() != 1 || runs.runs(0).ranks_size() != 1) return 0;
  std::uint64_t total = 0;
  for (const auto& layer : runs.runs(0).ranks(0).layers()) total += layer.samples();
  return total;
}

v1::SampleBatch batch(std::uint64_t step, std::uint32_t samples, std::uint32_t layers) {
  v1::SampleBatch out;
  for (std::uint32_t i = 0; i < samples; ++i) {
    *out.add_samples() = SimTrainer::make_sample(step, i % layers, 0.01);
  }
  return out;
}

// One trainer floods far past its stream's limit while another sends at a
// normal pace on the same agent: the flooder's excess is dropped and counted
// (by reason and per rank), its stream stays open, and every sample of the
// normal trainer is applied.
TEST(AgentRateLimit, FloodingTrainerIsShedNormalTrainerUnaffected) {
  TempDir dir;
  AgentConfig config = hermetic_config(dir);
  config.default_rules = false;
  config.trainer_sample_rate = 1000;
  config.trainer_sample_burst = 2000;
  Agent agent(config);
  auto admin = v1::AdminService::NewStub(unix_channel(config));

  constexpr std::uint32_t kLayers = 4;
  constexpr int kFloodBatches = 40;
  constexpr std::uint32_t kFloodBatch = 1000;
  constexpr std::uint64_t kFloodSamples = std::uint64_t{kFloodBatches} * kFloodBatch;
  constexpr int kCalmBatches = 20;
  constexpr std::uint32_t kCalmBatch = 10;  // 10 samples every 25 ms: 400/s < 1000/s
  constexpr std::uint64_t kCalmSamples = std::uint64_t{kCalmBatches} * kCalmBatch;

  const auto begin = std::chrono::steady_clock::now();
  SimTrainer flooder(unix_channel(config), SimTrainer::make_hello("run-flood", 0, 1, kLayers));
  ASSERT_TRUE(flooder.start());
  SimTrainer calm(unix_channel(config), SimTrainer::make_hello("run-calm", 0, 1, kLayers));
  ASSERT_TRUE(calm.start());

  std::atomic<bool> flood_ok{true};
  std::thread flood([&] {
    for (int b = 0; b < kFloodBatches; ++b) {
      if (!flooder.send_batch(batch(static_cast<std::uint64_t>(b), kFloodBatch, kLayers))) {
        flood_ok = false;
        return;
      }
    }
  });
  for (int b = 0; b < kCalmBatches; ++b) {
    ASSERT_TRUE(calm.send_batch(batch(static_cast<std::uint64_t>(b), kCalmBatch, kLayers)));
    std::this_thread::sleep_for(milliseconds(25));
  }
  flood.join();
  ASSERT_TRUE(flood_ok.load());

  const auto& counters = agent.controller().counters();
  const auto& shed = counters.samples_shed_total[static_cast<std::size_t>(ShedReason::kRateLimit)];
  // Every flood sample is either applied or shed; every calm sample is applied.
  ASSERT_TRUE(eventually([&] {
    return rank_samples(*admin, "run-flood") + shed->Value() == kFloodSamples &&
           rank_samples(*admin, "run-calm") == kCalmSamples;
  })) << "flood applied " << rank_samples(*admin, "run-flood") << " shed " << shed->Value()
      << ", calm applied " << rank_samples(*admin, "run-calm");
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();

  const std::uint64_t applied = rank_samples(*admin, "run-flood");
  const auto dropped = static_cast<std::uint64_t>(shed->Value());
  // The burst is granted; beyond it no more than the rate over the stream's life.
  EXPECT_GE(applied, 2000u);
  EXPECT_LE(static_cast<double>(applied), 2000.0 + 1000.0 * elapsed + 1.0)
      << "elapsed " << elapsed << " s";
  EXPECT_GT(dropped, 0u);
  EXPECT_EQ(counters.samples_received_total.Value(), applied + kCalmSamples);

  const std::string text = scrape(agent);
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_samples_shed_total{reason=\"rate_limit\"} " +
                                 std::to_string(dropped)))
      << text;
  EXPECT_TRUE(has_line(text, "gaugewatch_rank_samples_shed_total{run=\"run-flood\",rank=\"0\"} " +
                                 std::to_string(dropped)));
  EXPECT_TRUE(has_line(text, "gaugewatch_rank_samples_shed_total{run=\"run-calm\",rank=\"0\"} 0"));
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_samples_received_total " +
                                 std::to_string(applied + kCalmSamples)));
  // The admin API and gaugewatchctl show the same counts.
  {
    grpc::ClientContext context;
    v1::GetStatusResponse status;
    ASSERT_TRUE(admin->GetStatus(&context, {}, &status).ok());
    EXPECT_EQ(status.samples_shed_total(), dropped);
    EXPECT_EQ(status.samples_received_total(), applied + kCalmSamples);
    EXPECT_EQ(list_runs(*admin, "run-flood").runs(0).ranks(0).samples_shed_total(), dropped);
    EXPECT_EQ(list_runs(*admin, "run-calm").runs(0).ranks(0).samples_shed_total(), 0u);
    std::ostringstream out, err;
    ASSERT_EQ(run_ctl({"status", "--socket", config.grpc_socket}, out, err,
                      [](const char*) -> const char* { return nullptr; }),
              kCtlOk)
        << err.str();
    EXPECT_NE(out.str().find("samples shed      " + std::to_string(dropped) + " (rate limit)"),
              std::string::npos)
        << out.str();
  }
  // Shedding is not a rejection: both streams are still open and end cleanly.
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_trainers_connected 2"));
  EXPECT_TRUE(has_line(text, "gaugewatch_agent_samples_rejected_total 0"));

  // After a pause the flooder's bucket has refilled: a small batch is applied in full.
  std::this_thread::sleep_for(milliseconds(200));
  ASSERT_TRUE(flooder.send_batch(batch(99, 100, kLayers)));
  EXPECT_TRUE(eventually([&] { return rank_samples(*admin, "run-flood") == applied + 100; }));
  EXPECT_EQ(shed->Value(), dropped);
  EXPECT_TRUE(flooder.finish().ok());
  EXPECT_TRUE(calm.finish().ok());
}

TEST(AgentRateLimit, ZeroRateMeansUnlimited) {
  TempDir dir;
  AgentConfig config = hermetic_config(dir);
  config.default_rules = false;
  config.trainer_sample_rate = 0;
  config.trainer_sample_burst = 0;
  Agent agent(config);
  SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-fast", 0, 1, 4));
  ASSERT_TRUE(trainer.start());
  for (int b = 0; b < 20; ++b) ASSERT_TRUE(trainer.send_batch(batch(static_cast<std::uint64_t>(b), 4000, 4)));
  const auto& counters = agent.controller().counters();
  ASSERT_TRUE(eventually([&] { return counters.samples_received_total.Value() == 80000; }))
      << counters.samples_received_total.Value();
  EXPECT_EQ(counters.samples_shed_total[0]->Value(), 0u);
  EXPECT_TRUE(trainer.finish().ok());
}

grpc::Status set_backend(v1::AdminService::Stub& admin, const std::string& run,
                         std::optional<std::uint32_t> rank, std::vector<std::uint32_t> layers,
                         v1::Backend backend) {
  grpc::ClientContext context;
  v1::SetBackendRequest request;
  request.mutable_target()->set_run_id(run);
  if (rank) request.mutable_target()->set_rank(*rank);
  for (auto layer : layers) request.mutable_target()->add_layers(layer);
  request.set_backend(backend);
  request.set_reason("retention test");
  v1::SetBackendResponse response;
  return admin.SetBackend(&context, request, &response);
}

v1::ListDecisionsResponse history(v1::AdminService::Stub& admin) {
  grpc::ClientContext context;
  v1::ListDecisionsRequest request;
  request.set_include_audit(true);
  request.set_limit(1000);
  v1::ListDecisionsResponse response;
  EXPECT_TRUE(admin.ListDecisions(&context, request, &response).ok());
  return response;
}

// The agent's housekeeping prunes the audit log to its row bound and the
// decision history to the newest decision per scope plus the bounded history,
// exports what it did, and after a restart on the pruned database every
// decision in force is restored and re-sent, with command ids still growing.
TEST(AgentRetention, HousekeepingPrunesAndStateSurvivesRestart) {
  TempDir dir;
  AgentConfig config = hermetic_config(dir);
  config.default_rules = false;
  config.audit_max_rows = 20;
  config.audit_max_age_seconds = 0;
  config.decision_history = 3;
  config.retention_interval_seconds = 0.1;
  std::uint64_t last_command_id = 0;
  std::uint64_t oldest_decision_id = 0;
  {
    Agent agent(config);
    auto admin = v1::AdminService::NewStub(unix_channel(config));
    SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-r", 0, 1, 4));
    ASSERT_TRUE(trainer.start());
    // The oldest decision: every layer of run-r -> pivot. No newer decision
    // shares its scope, so it must survive every pass.
    ASSERT_TRUE(set_backend(*admin, "run-r", std::nullopt, {}, v1::BACKEND_PIVOT).ok());
    // Then 12 flips of rank 0 layer 1 (one scope), ending on gproj.
    for (int i = 0; i < 12; ++i) {
      ASSERT_TRUE(set_backend(*admin, "run-r", 0, {1},
                              i % 2 ? v1::BACKEND_GPROJ : v1::BACKEND_STOCK)
                      .ok());
    }
    auto commands = trainer.wait_commands(13, seconds(10));
    ASSERT_EQ(commands.size(), 13u);
    for (const auto& command : commands) ASSERT_TRUE(trainer.ack(command.command_id(), true, 1));
    last_command_id = commands.back().command_id();

    const auto& counters = agent.controller().counters();
    const auto audit = static_cast<std::size_t>(StoreTable::kAudit);
    const auto decisions = static_cast<std::size_t>(StoreTable::kDecisions);
    // 13 admin + 13 command_sent + 13 acked audit rows; 13 decisions in 2 scopes.
    ASSERT_TRUE(eventually([&] {
      return counters.store_rows[audit]->Value() == 20 && counters.store_rows[decisions]->Value() == 5 &&
             counters.store_pruned_rows_total[audit]->Value() == 39 - 20;
    })) << "audit rows " << counters.store_rows[audit]->Value() << " decisions "
        << counters.store_rows[decisions]->Value() << " audit pruned "
        << counters.store_pruned_rows_total[audit]->Value();
    EXPECT_EQ(counters.store_pruned_rows_total[decisions]->Value(), 8u);

    const auto kept = history(*admin);
    ASSERT_EQ(kept.decisions_size(), 5);
    EXPECT_EQ(kept.audit_size(), 20);
    // Newest first: the latest flip (gproj), two... and the oldest pivot last.
    EXPECT_EQ(kept.decisions(0).backend(), v1::BACKEND_GPROJ);
    EXPECT_EQ(kept.decisions(4).backend(), v1::BACKEND_PIVOT);
    EXPECT_EQ(kept.decisions(4).target().layers_size(), 0);
    oldest_decision_id = kept.decisions(4).decision_id();
    // The newest audit row is the last acknowledgement.
    EXPECT_EQ(kept.audit(0).kind(), v1::AUDIT_KIND_COMMAND_ACKED);

    const std::string text = scrape(agent);
    EXPECT_TRUE(has_line(text, "gaugewatch_agent_store_pruned_rows_total{table=\"audit\"} 19")) << text;
    EXPECT_TRUE(has_line(text, "gaugewatch_agent_store_pruned_rows_total{table=\"decisions\"} 8"));
    EXPECT_TRUE(has_line(text, "gaugewatch_agent_store_rows{table=\"audit\"} 20"));
    EXPECT_TRUE(has_line(text, "gaugewatch_agent_store_rows{table=\"decisions\"} 5"));
    EXPECT_EQ(text.find("gaugewatch_agent_retention_runs_total 0\n"), std::string::npos);
    EXPECT_TRUE(trainer.finish().ok());
    agent.shutdown();
  }

  Agent agent(config);  // the pruned database
  SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-r", 0, 1, 4));
  ASSERT_TRUE(trainer.start());
  auto commands = trainer.wait_commands(2, seconds(10));
  ASSERT_EQ(commands.size(), 2u);
  std::map<v1::Backend, std::vector<std::uint32_t>> restored;
  for (const auto& command : commands) {
    EXPECT_EQ(command.reason(), "restored decision on reconnect");
    EXPECT_GT(command.command_id(), last_command_id);  // ids continue past the pruned rows
    auto& layers = restored[command.switch_backend().backend()];
    layers.assign(command.switch_backend().layers().begin(), command.switch_backend().layers().end());
    if (command.switch_backend().backend() == v1::BACKEND_PIVOT) {
      EXPECT_EQ(command.decision_id(), oldest_decision_id);
    }
  }
  EXPECT_EQ(restored[v1::BACKEND_PIVOT], (std::vector<std::uint32_t>{0, 2, 3}));
  EXPECT_EQ(restored[v1::BACKEND_GPROJ], (std::vector<std::uint32_t>{1}));
  EXPECT_TRUE(trainer.finish().ok());
}

}  // namespace
}  // namespace gaugewatch::agent
