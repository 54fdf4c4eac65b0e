#include "agent/store/decision_store.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "agent/state/decision_book.h"
#include "tests/agent/temp_dir.h"

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;

v1::Decision decision(const std::string& run, bool all_runs, std::optional<std::uint32_t> rank,
                      std::vector<std::uint32_t> layers, v1::Backend backend) {
  v1::Decision d;
  d.set_unix_time_ns(1);
  d.set_source(v1::DECISION_SOURCE_ADMIN);
  d.set_rule("test");
  d.mutable_target()->set_run_id(run);
  d.mutable_target()->set_all_runs(all_runs);
  if (rank) d.mutable_target()->set_rank(*rank);
  for (auto l : layers) d.mutable_target()->add_layers(l);
  d.set_backend(backend);
  d.set_reason("because");
  return d;
}

TEST(DecisionStore, WalModeAndSurvivesReopen) {
  TempDir dir;
  const std::string path = dir.path() + "/agent.db";
  {
    DecisionStore store(path);
    EXPECT_EQ(store.journal_mode(), "wal");
    auto d1 = decision("r1", false, 2, {0, 5}, v1::BACKEND_GPROJ);
    store.add_decision(d1);
    EXPECT_EQ(d1.decision_id(), 1u);
    auto d2 = decision("", true, std::nullopt, {}, v1::BACKEND_PIVOT);
    store.add_decision(d2);
    v1::AuditRecord record;
    record.set_kind(v1::AUDIT_KIND_COMMAND_SENT);
    record.set_run_id("r1");
    record.set_command_id(41);
    record.set_detail("switch");
    store.add_audit(record);
  }
  DecisionStore store(path);
  const auto all = store.all_decisions();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].target().run_id(), "r1");
  EXPECT_EQ(all[0].target().rank(), 2u);
  EXPECT_EQ(all[0].target().layers_size(), 2);
  EXPECT_EQ(all[0].target().layers(1), 5u);
  EXPECT_TRUE(all[1].target().all_runs());
  EXPECT_FALSE(all[1].target().has_rank());
  EXPECT_EQ(store.max_command_id(), 41u);
  const auto newest = store.decisions("r2", 10);  // all-runs decisions cover r2
  ASSERT_EQ(newest.size(), 1u);
  EXPECT_EQ(newest[0].backend(), v1::BACKEND_PIVOT);
  ASSERT_EQ(store.audit("r1", 10).size(), 1u);
  EXPECT_TRUE(store.audit("r2", 10).empty());
}

TEST(DecisionStore, UnopenableDatabaseThrows) {
  EXPECT_THROW(DecisionStore("/nonexistent-dir/x/agent.db"), StoreError);
}

TEST(DecisionBook, NewestCoveringDecisionWins) {
  DecisionBook book;
  auto d1 = decision("r1", false, std::nullopt, {1, 2}, v1::BACKEND_GPROJ);
  d1.set_decision_id(1);
  book.add(d1);
  auto d2 = decision("", true, std::nullopt, {2}, v1::BACKEND_FP32);
  d2.set_decision_id(2);
  book.add(d2);
  auto d3 = decision("r1", false, 7, {}, v1::BACKEND_STOCK);
  d3.set_decision_id(3);
  book.add(d3);
  EXPECT_EQ(book.desired("r1", 0, 1).backend, v1::BACKEND_GPROJ);
  EXPECT_EQ(book.desired("r1", 0, 2).backend, v1::BACKEND_FP32);
  EXPECT_EQ(book.desired("r9", 0, 2).decision_id, 2u);
  EXPECT_EQ(book.desired("r9", 0, 1).backend, v1::BACKEND_UNSPECIFIED);
  EXPECT_EQ(book.desired("r1", 7, 1).backend, v1::BACKEND_STOCK);
}

}  // namespace
}  // namespace gaugewatch::agent
