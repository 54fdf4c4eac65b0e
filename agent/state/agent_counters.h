#pragma once
// The agent's self-metric counters (exported as gaugewatch_agent_*).

#include <array>
#include <atomic>
#include <cstdint>

#include "agent/server/message_validator.h"

namespace gaugewatch::agent {

// Upper bounds (seconds) of the sample-age histogram: time from the trainer
// stamping a sample (Sample.unix_time_ns) to the agent applying it.
inline constexpr std::array<double, 16> kSampleAgeBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,   10.0};

// Why the agent discarded valid samples (gaugewatch_agent_samples_shed_total{reason}).
enum class ShedReason : std::uint8_t { kRateLimit, kCount };
inline constexpr std::size_t kShedReasonCount = static_cast<std::size_t>(ShedReason::kCount);
inline constexpr const char* shed_reason_name(ShedReason reason) {
  return reason == ShedReason::kRateLimit ? "rate_limit" : "unknown";
}

// Tables the retention pass prunes (gaugewatch_agent_store_*{table}).
enum class StoreTable : std::uint8_t { kAudit, kDecisions, kCount };
inline constexpr std::size_t kStoreTableCount = static_cast<std::size_t>(StoreTable::kCount);
inline constexpr const char* store_table_name(StoreTable table) {
  return table == StoreTable::kAudit ? "audit" : "decisions";
}

struct AgentCounters {
  // Cumulative counts are computed at exposition; here each bucket counts
  // the observations that fall in it (last one: above 10 s).
  std::array<std::atomic<std::uint64_t>, kSampleAgeBuckets.size() + 1> sample_age_bucket{};
  std::atomic<std::uint64_t> sample_age_count{0};
  std::atomic<std::uint64_t> sample_age_sum_ns{0};
  void observe_sample_age(std::int64_t age_ns) {
    if (age_ns < 0) age_ns = 0;
    const double seconds = static_cast<double>(age_ns) / 1e9;
    std::size_t i = 0;
    while (i < kSampleAgeBuckets.size() && seconds > kSampleAgeBuckets[i]) ++i;
    sample_age_bucket[i].fetch_add(1, std::memory_order_relaxed);
    sample_age_count.fetch_add(1, std::memory_order_relaxed);
    sample_age_sum_ns.fetch_add(static_cast<std::uint64_t>(age_ns), std::memory_order_relaxed);
  }

  std::atomic<std::uint64_t> connections_total{0};
  std::atomic<std::int64_t> trainers_connected{0};
  std::atomic<std::uint64_t> samples_received_total{0};
  std::atomic<std::uint64_t> samples_rejected_total{0};
  std::atomic<std::uint64_t> hook_dropped_total{0};     // reported by trainers
  std::atomic<std::uint64_t> commands_dropped_total{0}; // outbox of a gone trainer
  std::array<std::atomic<std::uint64_t>, kRejectReasonCount> messages_rejected_total{};
  std::atomic<std::uint64_t> commands_sent_total{0};
  std::atomic<std::uint64_t> switch_commands_total{0};
  std::atomic<std::uint64_t> acks_applied_total{0};
  std::atomic<std::uint64_t> acks_rejected_total{0};
  std::atomic<std::uint64_t> acks_unknown_total{0};
  std::array<std::atomic<std::uint64_t>, 4> decisions_total{};  // by DecisionSource
  std::atomic<std::uint64_t> rule_evaluations_total{0};
  std::atomic<std::uint64_t> rule_firings_total{0};
  std::atomic<std::uint64_t> promql_queries_total{0};
  std::atomic<std::uint64_t> promql_errors_total{0};
  std::atomic<std::uint64_t> store_errors_total{0};
  std::atomic<std::uint64_t> scrapes_total{0};
  std::atomic<std::uint64_t> last_scrape_duration_ns{0};
  std::atomic<std::uint64_t> ranks_expired_total{0};
  std::array<std::atomic<std::uint64_t>, kShedReasonCount> samples_shed_total{};
  // Retention: rows deleted, rows left after the last pass, passes run.
  std::array<std::atomic<std::uint64_t>, kStoreTableCount> store_pruned_rows_total{};
  std::array<std::atomic<std::uint64_t>, kStoreTableCount> store_rows{};
  std::atomic<std::uint64_t> retention_runs_total{0};
  std::atomic<std::uint64_t> hook_streams_refused_total{0};  // TCP without the bearer token
};

}  // namespace gaugewatch::agent
