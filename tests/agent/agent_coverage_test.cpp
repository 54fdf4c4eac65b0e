// Issue 11 on the agent side, through a real agent: coverage the hook reports
// (attention calls, unmonitored layers and why), the default rule's
// escalation by correcting backends, and Goodbye.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <sstream>
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

v1::SampleBatch tripping(std::uint64_t step, std::uint32_t layer, std::vector<v1::Backend> correcting) {
  v1::SampleBatch batch;
  auto sample = SimTrainer::make_sample(step, layer, 0.30);  // over the default rule's 5%
  for (auto backend : correcting) sample.add_correcting_backends(backend);
  *batch.add_samples() = sample;
  return batch;
}

TEST(AgentCoverage, CoverageIsExportedAndShownWithReasons) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  SimTrainer trainer(unix_channel(agent.config()), SimTrainer::make_hello("run-k", 0, 1, 3));
  ASSERT_TRUE(trainer.start());
  v1::SampleBatch batch;
  auto* monitored = batch.add_attention_calls();
  monitored->set_monitored(true);
  monitored->set_calls_total(120);
  auto* dropout = batch.add_attention_calls();
  dropout->set_monitored(false);
  dropout->set_reason("dropout");
  dropout->set_calls_total(40);
  auto* status = batch.add_layer_status();
  status->set_layer(2);
  status->set_monitored(false);
  status->set_reason("dropout");
  ASSERT_TRUE(trainer.send_batch(batch));
  ASSERT_TRUE(eventually([&] {
    return scrape(agent).find("gaugewatch_rank_attention_calls_total{run=\"run-k\",rank=\"0\",monitored=\"false\","
                              "reason=\"dropout\"} 40\n") != std::string::npos;
  })) << scrape(agent);
  EXPECT_NE(scrape(agent).find("gaugewatch_rank_attention_calls_total{run=\"run-k\",rank=\"0\",monitored=\"true\","
                               "reason=\"\"} 120\n"),
            std::string::npos);
  std::ostringstream out, err;
  ASSERT_EQ(run_ctl({"layers", "--socket", agent.config().grpc_socket, "--run", "run-k"}, out, err,
                    [](const char*) -> const char* { return nullptr; }),
            kCtlOk)
      << err.str();
  EXPECT_NE(out.str().find("no: dropout"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("MONITORED"), std::string::npos);
  // A layer index past the Hello's is refused.
  v1::SampleBatch bad;
  bad.add_layer_status()->set_layer(3);
  ASSERT_TRUE(trainer.send_batch(bad));
  EXPECT_EQ(trainer.wait_end(seconds(10)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(AgentCoverage, DefaultRuleEscalatesByCorrectingBackends) {
  TempDir dir;
  Agent agent(hermetic_config(dir));
  SimTrainer trainer(unix_channel(agent.config()), SimTrainer::make_hello("run-g", 0, 1, 3));
  ASSERT_TRUE(trainer.start());
  for (std::uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(trainer.send_batch(tripping(step, 0, {v1::BACKEND_GPROJ, v1::BACKEND_CENTER})));
    ASSERT_TRUE(trainer.send_batch(tripping(step, 1, {v1::BACKEND_CENTER})));
    ASSERT_TRUE(trainer.send_batch(tripping(step, 2, {v1::BACKEND_FP32})));
  }
  const auto commands = trainer.wait_commands(2, seconds(10));
  ASSERT_EQ(commands.size(), 2u);
  std::map<std::uint32_t, v1::Backend> switched;
  for (const auto& command : commands) {
    ASSERT_TRUE(command.has_switch_backend());
    for (auto layer : command.switch_backend().layers()) switched[layer] = command.switch_backend().backend();
  }
  EXPECT_EQ(switched[0], v1::BACKEND_GPROJ);
  EXPECT_EQ(switched[1], v1::BACKEND_CENTER);
  EXPECT_EQ(switched.count(2), 0u) << "a layer no correcting backend fits was switched";
  EXPECT_TRUE(trainer.wait_commands(3, milliseconds(300)).size() == 2u);
  const std::string text = scrape(agent);
  EXPECT_NE(text.find("gaugewatch_agent_escalations_uncorrectable_total 1\n"), std::string::npos) << text;
  // What was chosen and why is in the decision record.
  auto admin = v1::AdminService::NewStub(unix_channel(agent.config()));
  grpc::ClientContext context;
  v1::ListDecisionsRequest request;
  request.set_include_audit(true);
  v1::ListDecisionsResponse response;
  ASSERT_TRUE(admin->ListDecisions(&context, request, &response).ok());
  ASSERT_EQ(response.decisions_size(), 2);
  bool center_why = false;
  for (const auto& decision : response.decisions()) {
    if (decision.backend() == v1::BACKEND_CENTER) {
      center_why = decision.reason().find("gproj cannot correct this layer; center can") != std::string::npos;
    }
  }
  EXPECT_TRUE(center_why);
  bool reported = false;
  for (const auto& record : response.audit()) {
    reported = reported || record.detail().find("not switched") != std::string::npos;
  }
  EXPECT_TRUE(reported) << "the uncorrectable layer is not in the audit log";
  EXPECT_TRUE(trainer.finish().ok());
}

TEST(AgentCoverage, GoodbyeMarksTheRankFinished) {
  TempDir dir;
  AgentConfig config = hermetic_config(dir);
  config.rank_expiry_seconds = 0.3;
  Agent agent(config);
  SimTrainer trainer(unix_channel(config), SimTrainer::make_hello("run-f", 0, 1, 1));
  ASSERT_TRUE(trainer.start());
  v1::TrainerMessage goodbye;
  goodbye.mutable_goodbye()->set_last_step(99);
  goodbye.mutable_goodbye()->set_reason("exit");
  ASSERT_TRUE(trainer.send(goodbye));
  EXPECT_TRUE(trainer.finish().ok());
  auto admin = v1::AdminService::NewStub(unix_channel(config));
  ASSERT_TRUE(eventually([&] {
    grpc::ClientContext context;
    v1::ListRunsRequest request;
    v1::ListRunsResponse response;
    return admin->ListRuns(&context, request, &response).ok() && response.runs_size() == 1 &&
           response.runs(0).ranks(0).finished() && !response.runs(0).ranks(0).connected();
  }));
  std::ostringstream out, err;
  ASSERT_EQ(run_ctl({"layers", "--socket", config.grpc_socket}, out, err,
                    [](const char*) -> const char* { return nullptr; }),
            kCtlOk);
  EXPECT_NE(out.str().find("finished"), std::string::npos) << out.str();
  // Past the expiry time it is still finished, never expired.
  std::this_thread::sleep_for(milliseconds(800));
  const std::string text = scrape(agent);
  EXPECT_NE(text.find("gaugewatch_rank_expired{run=\"run-f\",rank=\"0\"} 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gaugewatch_rank_finished{run=\"run-f\",rank=\"0\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_ranks_expired_total 0\n"), std::string::npos);
}

}  // namespace
}  // namespace gaugewatch::agent
