#pragma once
// The agent's self-metrics (gaugewatch_agent_*), as prometheus-cpp counters,
// gauges and a histogram in one prometheus::Registry. Names and help come
// from the catalogue (agent/export/metric_catalogue.h). Labelled families
// (reason, status, source, table) have one child per bounded label value,
// created here, so the hot path never looks a label set up.

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "agent/common/reject_reason.h"

namespace gaugewatch::agent {

// Upper bounds (seconds) of the sample-age histogram: time from the trainer
// stamping a sample (Sample.unix_time_ns) to the agent applying it.
inline constexpr std::array<double, 16> kSampleAgeBuckets = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   5.0,   10.0};

// Sample ages of one batch, observed into the histogram at once (one lock
// of the histogram per batch instead of one per sample).
class SampleAgeBatch {
 public:
  void add(std::int64_t age_ns);
  bool empty() const { return count_ == 0; }
  const std::vector<double>& increments() const { return increments_; }
  double sum_seconds() const { return sum_seconds_; }

 private:
  std::vector<double> increments_ = std::vector<double>(kSampleAgeBuckets.size() + 1, 0.0);
  double sum_seconds_ = 0;
  std::size_t count_ = 0;
};

// Why the agent discarded valid samples (gaugewatch_agent_samples_shed_total{reason}).
enum class ShedReason : std::uint8_t { kRateLimit, kCount };
inline constexpr std::size_t kShedReasonCount = static_cast<std::size_t>(ShedReason::kCount);
inline constexpr const char* shed_reason_name(ShedReason reason) {
  return reason == ShedReason::kRateLimit ? "rate_limit" : "unknown";
}

// Why a trainer stream was refused or ended by a limit
// (gaugewatch_agent_streams_refused_total{reason}).
enum class StreamRefusal : std::uint8_t { kStreamLimit, kRankLimit, kHelloDeadline, kCount };
inline constexpr std::size_t kStreamRefusalCount = static_cast<std::size_t>(StreamRefusal::kCount);
inline constexpr const char* stream_refusal_name(StreamRefusal reason) {
  switch (reason) {
    case StreamRefusal::kStreamLimit: return "stream_limit";
    case StreamRefusal::kRankLimit: return "rank_limit";
    case StreamRefusal::kHelloDeadline: return "hello_deadline";
    case StreamRefusal::kCount: break;
  }
  return "unknown";
}

// Tables the retention pass prunes (gaugewatch_agent_store_*{table}).
enum class StoreTable : std::uint8_t { kAudit, kDecisions, kCount };
inline constexpr std::size_t kStoreTableCount = static_cast<std::size_t>(StoreTable::kCount);
inline constexpr const char* store_table_name(StoreTable table) {
  return table == StoreTable::kAudit ? "audit" : "decisions";
}

// Command acknowledgement statuses (gaugewatch_agent_command_acks_total{status}).
enum class AckStatus : std::uint8_t { kApplied, kRejected, kUnknown, kCount };
inline constexpr std::size_t kAckStatusCount = static_cast<std::size_t>(AckStatus::kCount);

class AgentCounters {
 public:
  AgentCounters();
  AgentCounters(const AgentCounters&) = delete;
  AgentCounters& operator=(const AgentCounters&) = delete;

  // Every self-metric, for the exposition.
  const prometheus::Registry& registry() const { return registry_; }

 private:
  prometheus::Registry registry_;

 public:
  prometheus::Gauge& start_time_seconds;
  prometheus::Gauge& trainers_connected;
  prometheus::Counter& connections_total;
  prometheus::Counter& samples_received_total;
  prometheus::Counter& samples_rejected_total;
  prometheus::Counter& hook_dropped_total;      // reported by trainers
  prometheus::Counter& commands_dropped_total;  // outbox of a gone trainer
  // Index 0 (kNone) stays null: it is no rejection.
  std::array<prometheus::Counter*, kRejectReasonCount> messages_rejected_total{};
  prometheus::Counter& commands_sent_total;
  prometheus::Counter& switch_commands_total;
  std::array<prometheus::Counter*, kAckStatusCount> acks_total{};
  // By DecisionSource (1 admin, 2 rule, 3 promql_rule); 0 (unspecified) stays null.
  std::array<prometheus::Counter*, 4> decisions_total{};
  prometheus::Counter& rule_evaluations_total;
  prometheus::Counter& rule_firings_total;
  prometheus::Counter& escalations_uncorrectable_total;
  prometheus::Counter& promql_queries_total;
  prometheus::Counter& promql_errors_total;
  prometheus::Counter& store_errors_total;
  prometheus::Counter& scrapes_total;
  prometheus::Gauge& last_scrape_duration_seconds;
  prometheus::Counter& ranks_expired_total;
  prometheus::Histogram& sample_age_seconds;
  prometheus::Counter& samples_clock_skew_total;
  std::array<prometheus::Counter*, kShedReasonCount> samples_shed_total{};
  std::array<prometheus::Counter*, kStreamRefusalCount> streams_refused_total{};
  // Retention: rows deleted, rows left after the last pass, passes run.
  std::array<prometheus::Counter*, kStoreTableCount> store_pruned_rows_total{};
  std::array<prometheus::Gauge*, kStoreTableCount> store_rows{};
  prometheus::Counter& retention_runs_total;
  prometheus::Counter& hook_streams_refused_total;  // TCP without the bearer token

  prometheus::Counter& rejected(RejectReason reason) {
    return *messages_rejected_total[static_cast<std::size_t>(reason)];
  }
  prometheus::Counter& acks(AckStatus status) {
    return *acks_total[static_cast<std::size_t>(status)];
  }
  prometheus::Counter& refused(StreamRefusal reason) {
    return *streams_refused_total[static_cast<std::size_t>(reason)];
  }
  void observe(const SampleAgeBatch& batch) {
    if (!batch.empty()) sample_age_seconds.ObserveMultiple(batch.increments(), batch.sum_seconds());
  }
};

}  // namespace gaugewatch::agent
