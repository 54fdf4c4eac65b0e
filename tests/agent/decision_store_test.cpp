#include "agent/store/decision_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "agent/server/token_bucket.h"
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

v1::AuditRecord audit_at(std::int64_t time_ns, std::uint64_t command_id) {
  v1::AuditRecord record;
  record.set_unix_time_ns(time_ns);
  record.set_kind(v1::AUDIT_KIND_COMMAND_SENT);
  record.set_run_id("r1");
  record.set_command_id(command_id);
  record.set_detail("switch");
  return record;
}

TEST(DecisionStoreRetention, AuditByAgeThenByRowsKeepsTheNewest) {
  TempDir dir;
  DecisionStore store(dir.path() + "/agent.db");
  constexpr std::int64_t kSecond = 1'000'000'000;
  const std::int64_t now = 1'000'000 * kSecond;
  // 3000 old rows (an hour old and more; more than one prune chunk), then 100 recent ones.
  for (int i = 0; i < 3000; ++i) {
    auto record = audit_at(now - 7200 * kSecond + i, static_cast<std::uint64_t>(i + 1));
    store.add_audit(record);
  }
  for (int i = 0; i < 100; ++i) {
    auto record = audit_at(now - 60 * kSecond + i, 0);
    store.add_audit(record);
  }
  ASSERT_EQ(store.count_rows("audit"), 3100u);
  RetentionPolicy policy;
  policy.audit_max_age_ns = 3600 * kSecond;
  PruneResult result = store.prune(policy, now);
  EXPECT_EQ(result.audit_deleted, 3000u);
  EXPECT_EQ(result.audit_rows, 100u);
  EXPECT_EQ(store.count_rows("audit"), 100u);
  for (const auto& record : store.audit("", 1000)) {
    EXPECT_GE(record.unix_time_ns(), now - 3600 * kSecond);
  }
  // The command ids of the deleted rows still count: ids continue after 3000.
  EXPECT_EQ(store.max_command_id(), 3000u);

  policy.audit_max_rows = 30;
  result = store.prune(policy, now);
  EXPECT_EQ(result.audit_deleted, 70u);
  EXPECT_EQ(result.audit_rows, 30u);
  const auto left = store.audit("", 1000);
  ASSERT_EQ(left.size(), 30u);
  EXPECT_EQ(left.front().audit_id(), 3100u);  // newest first: the newest 30 stay
  EXPECT_EQ(left.back().audit_id(), 3071u);
  // Nothing more to do: a second pass deletes nothing.
  EXPECT_EQ(store.prune(policy, now).audit_deleted, 0u);
  // Unbounded policy deletes nothing either.
  EXPECT_EQ(store.prune(RetentionPolicy{}, now).audit_deleted, 0u);
  EXPECT_EQ(store.count_rows("audit"), 30u);

  // Everything aged out: the table is empty, the largest command id survives
  // the prune and a reopen.
  policy.audit_max_age_ns = 1;
  store.prune(policy, now + 3600 * kSecond);
  EXPECT_EQ(store.count_rows("audit"), 0u);
  EXPECT_EQ(store.max_command_id(), 3000u);
  DecisionStore reopened(dir.path() + "/agent.db");
  EXPECT_EQ(reopened.max_command_id(), 3000u);
}

// Retention runs on its own connection while the hot path keeps writing:
// no write fails (busy) or is lost, and the pass deletes exactly the old rows.
TEST(DecisionStoreRetention, ConcurrentWritesDuringPruneSucceed) {
  TempDir dir;
  DecisionStore store(dir.path() + "/agent.db");
  constexpr std::int64_t kSecond = 1'000'000'000;
  const std::int64_t now = 2'000'000 * kSecond;
  constexpr int kOld = 30000;  // 15 chunks
  for (int i = 0; i < kOld; ++i) {
    auto record = audit_at(now - 86400 * kSecond + i, 0);
    store.add_audit(record);
  }
  std::atomic<bool> pruning{true};
  std::atomic<int> written{0};
  std::atomic<int> written_while_pruning{0};
  std::string failure;
  std::thread writer([&] {
    try {
      for (int i = 0; i < 400; ++i) {
        auto record = audit_at(now, static_cast<std::uint64_t>(100000 + i));
        store.add_audit(record);
        ++written;
        if (pruning.load()) ++written_while_pruning;
      }
    } catch (const StoreError& e) {
      failure = e.what();
    }
  });
  RetentionPolicy policy;
  policy.audit_max_age_ns = 3600 * kSecond;
  const PruneResult result = store.prune(policy, now);
  pruning = false;
  writer.join();
  EXPECT_TRUE(failure.empty()) << failure;
  EXPECT_EQ(written.load(), 400);
  EXPECT_EQ(result.audit_deleted, static_cast<std::uint64_t>(kOld));
  EXPECT_EQ(store.count_rows("audit"), 400u);
  EXPECT_EQ(store.max_command_id(), 100399u);
  std::printf("writes during the prune: %d of 400\n", written_while_pruning.load());
}

TEST(DecisionStoreRetention, DecisionsKeepNewestPerScopePlusBoundedHistory) {
  TempDir dir;
  DecisionStore store(dir.path() + "/agent.db");
  std::vector<v1::Decision> added;
  auto add = [&](v1::Decision d) {
    store.add_decision(d);
    added.push_back(d);
  };
  // Oldest: run r1, all layers -> pivot (its scope never gets a newer one).
  add(decision("r1", false, std::nullopt, {}, v1::BACKEND_PIVOT));
  add(decision("", true, std::nullopt, {4}, v1::BACKEND_FP32));
  // 20 flips of r1 rank 0 layer 1, and 10 of r1 rank 1 layers 2,3.
  for (int i = 0; i < 20; ++i) {
    add(decision("r1", false, 0, {1}, i % 2 ? v1::BACKEND_GPROJ : v1::BACKEND_STOCK));
    if (i % 2 == 0) {
      add(decision("r1", false, 1, {2, 3}, i % 4 ? v1::BACKEND_STOCK : v1::BACKEND_GPROJ));
    }
  }
  ASSERT_EQ(store.count_rows("decisions"), 32u);
  DecisionBook before;
  for (const auto& d : store.all_decisions()) before.add(d);

  RetentionPolicy policy;
  policy.decision_history = 5;
  const PruneResult result = store.prune(policy, 0);
  // 4 scopes keep their newest; of the 28 superseded, the newest 5 stay.
  EXPECT_EQ(result.decisions_deleted, 23u);
  EXPECT_EQ(result.decision_rows, 9u);
  const auto kept = store.all_decisions();
  ASSERT_EQ(kept.size(), 9u);
  EXPECT_EQ(kept[0].decision_id(), added[0].decision_id());  // the oldest, still in force
  EXPECT_EQ(kept[1].decision_id(), added[1].decision_id());
  EXPECT_EQ(kept.back().decision_id(), added.back().decision_id());

  // The desired backend of every (run, rank, layer) is what it was.
  DecisionBook after;
  for (const auto& d : kept) after.add(d);
  for (const char* run : {"r1", "r2"}) {
    for (std::uint32_t rank = 0; rank < 3; ++rank) {
      for (std::uint32_t layer = 0; layer < 6; ++layer) {
        const auto a = before.desired(run, rank, layer);
        const auto b = after.desired(run, rank, layer);
        EXPECT_EQ(a.backend, b.backend) << run << " " << rank << " " << layer;
        EXPECT_EQ(a.decision_id, b.decision_id) << run << " " << rank << " " << layer;
      }
    }
  }
  EXPECT_EQ(before.desired("r1", 0, 1).backend, v1::BACKEND_GPROJ);
  EXPECT_EQ(after.desired("r1", 3, 0).backend, v1::BACKEND_PIVOT);
  EXPECT_EQ(after.desired("r7", 3, 4).backend, v1::BACKEND_FP32);

  policy.decision_history = 0;
  EXPECT_EQ(store.prune(policy, 0).decisions_deleted, 5u);
  EXPECT_EQ(store.count_rows("decisions"), 4u);
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

TEST(DecisionBook, HoldsOnlyTheNewestDecisionPerScope) {
  DecisionBook book;
  std::uint64_t id = 0;
  for (int i = 0; i < 1000; ++i) {
    auto d = decision("r1", false, 0, {1, 2}, i % 2 ? v1::BACKEND_GPROJ : v1::BACKEND_STOCK);
    d.set_decision_id(++id);
    book.add(d);
  }
  auto other = decision("r1", false, 0, {2, 1}, v1::BACKEND_FP32);  // another layer order: another scope
  other.set_decision_id(++id);
  book.add(other);
  EXPECT_EQ(book.size(), 1001u);
  EXPECT_EQ(book.in_force(), 2u);
  EXPECT_EQ(book.desired("r1", 0, 1).backend, v1::BACKEND_FP32);
  auto narrow = decision("r1", false, 0, {1}, v1::BACKEND_PIVOT);
  narrow.set_decision_id(++id);
  book.add(narrow);
  EXPECT_EQ(book.in_force(), 3u);
  EXPECT_EQ(book.desired("r1", 0, 1).backend, v1::BACKEND_PIVOT);
  EXPECT_EQ(book.desired("r1", 0, 2).backend, v1::BACKEND_FP32);
}

TEST(TokenBucket, GrantsBurstThenRateAndNeverMore) {
  constexpr std::int64_t kMs = 1'000'000;
  TokenBucket bucket(1000.0, 200.0, 0);
  EXPECT_EQ(bucket.take(150, 0), 150u);
  EXPECT_EQ(bucket.take(150, 0), 50u);  // the burst is spent
  EXPECT_EQ(bucket.take(10, 0), 0u);
  EXPECT_EQ(bucket.take(100, 10 * kMs), 10u);   // 10 ms at 1000/s
  EXPECT_EQ(bucket.take(100, 10 * kMs), 0u);
  EXPECT_EQ(bucket.take(1000, 5000 * kMs), 200u);  // refill caps at the burst
  EXPECT_EQ(bucket.take(1, 4000 * kMs), 0u);     // time going backwards grants nothing
  // Half tokens accumulate.
  EXPECT_EQ(bucket.take(1, 5000 * kMs + kMs / 2), 0u);
  EXPECT_EQ(bucket.take(1, 5001 * kMs), 1u);
  TokenBucket unlimited(0.0, 0.0, 0);
  EXPECT_TRUE(unlimited.unlimited());
  EXPECT_EQ(unlimited.take(1u << 30, 0), 1u << 30);
}

}  // namespace
}  // namespace gaugewatch::agent
