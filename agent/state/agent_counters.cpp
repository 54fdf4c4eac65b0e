#include "agent/state/agent_counters.h"

#include <string>

#include "agent/common/backend_names.h"
#include "agent/export/metric_catalogue.h"

namespace gaugewatch::agent {

namespace {

template <typename Builder>
auto& family(Builder builder, prometheus::Registry& registry, AgentMetric id) {
  const auto& row = kAgentMetricRows[static_cast<std::size_t>(id)];
  return builder.Name(std::string(row.name)).Help(std::string(row.help)).Register(registry);
}

prometheus::Counter& counter(prometheus::Registry& registry, AgentMetric id,
                             const prometheus::Labels& labels = {}) {
  return family(prometheus::BuildCounter(), registry, id).Add(labels);
}

prometheus::Gauge& gauge(prometheus::Registry& registry, AgentMetric id,
                         const prometheus::Labels& labels = {}) {
  return family(prometheus::BuildGauge(), registry, id).Add(labels);
}

prometheus::Histogram& histogram(prometheus::Registry& registry, AgentMetric id) {
  return family(prometheus::BuildHistogram(), registry, id)
      .Add({}, prometheus::Histogram::BucketBoundaries(kSampleAgeBuckets.begin(),
                                                       kSampleAgeBuckets.end()));
}

}  // namespace

void SampleAgeBatch::add(std::int64_t age_ns) {
  if (age_ns < 0) age_ns = 0;
  const double seconds = static_cast<double>(age_ns) / 1e9;
  std::size_t i = 0;
  while (i < kSampleAgeBuckets.size() && seconds > kSampleAgeBuckets[i]) ++i;
  increments_[i] += 1;
  sum_seconds_ += seconds;
  ++count_;
}

AgentCounters::AgentCounters()
    : start_time_seconds(gauge(registry_, AgentMetric::kStartTime)),
      trainers_connected(gauge(registry_, AgentMetric::kTrainersConnected)),
      connections_total(counter(registry_, AgentMetric::kConnections)),
      samples_received_total(counter(registry_, AgentMetric::kSamplesReceived)),
      samples_rejected_total(counter(registry_, AgentMetric::kSamplesRejected)),
      hook_dropped_total(counter(registry_, AgentMetric::kSamplesDropped)),
      commands_dropped_total(counter(registry_, AgentMetric::kCommandsDropped)),
      commands_sent_total(counter(registry_, AgentMetric::kCommandsSent)),
      switch_commands_total(counter(registry_, AgentMetric::kSwitches)),
      rule_evaluations_total(counter(registry_, AgentMetric::kRuleEvaluations)),
      rule_firings_total(counter(registry_, AgentMetric::kRuleFirings)),
      escalations_uncorrectable_total(counter(registry_, AgentMetric::kEscalationsUncorrectable)),
      promql_queries_total(counter(registry_, AgentMetric::kPromqlQueries)),
      promql_errors_total(counter(registry_, AgentMetric::kPromqlErrors)),
      store_errors_total(counter(registry_, AgentMetric::kStoreErrors)),
      scrapes_total(counter(registry_, AgentMetric::kScrapes)),
      last_scrape_duration_seconds(gauge(registry_, AgentMetric::kScrapeDuration)),
      ranks_expired_total(counter(registry_, AgentMetric::kRanksExpired)),
      sample_age_seconds(histogram(registry_, AgentMetric::kSampleAge)),
      samples_clock_skew_total(counter(registry_, AgentMetric::kSampleClockSkew)),
      retention_runs_total(counter(registry_, AgentMetric::kRetentionRuns)),
      hook_streams_refused_total(counter(registry_, AgentMetric::kStreamsUnauthenticated)) {
  gauge(registry_, AgentMetric::kBuildInfo, {{"version", std::string(kAgentVersion)}}).Set(1);
  for (std::size_t r = 1; r < kRejectReasonCount; ++r) {
    messages_rejected_total[r] =
        &counter(registry_, AgentMetric::kMessagesRejected,
                 {{"reason", std::string(reject_reason_name(static_cast<RejectReason>(r)))}});
  }
  const char* statuses[kAckStatusCount] = {"applied", "rejected", "unknown"};
  for (std::size_t s = 0; s < kAckStatusCount; ++s) {
    acks_total[s] = &counter(registry_, AgentMetric::kCommandAcks, {{"status", statuses[s]}});
  }
  const char* sources[4] = {"", "admin", "rule", "promql_rule"};
  for (std::size_t s = 1; s < 4; ++s) {
    decisions_total[s] = &counter(registry_, AgentMetric::kDecisions, {{"source", sources[s]}});
  }
  for (std::size_t r = 0; r < kShedReasonCount; ++r) {
    samples_shed_total[r] = &counter(registry_, AgentMetric::kSamplesShed,
                                     {{"reason", shed_reason_name(static_cast<ShedReason>(r))}});
  }
  for (std::size_t r = 0; r < kStreamRefusalCount; ++r) {
    streams_refused_total[r] =
        &counter(registry_, AgentMetric::kStreamsRefused,
                 {{"reason", stream_refusal_name(static_cast<StreamRefusal>(r))}});
  }
  for (std::size_t t = 0; t < kStoreTableCount; ++t) {
    const prometheus::Labels table{{"table", store_table_name(static_cast<StoreTable>(t))}};
    store_pruned_rows_total[t] = &counter(registry_, AgentMetric::kStorePrunedRows, table);
    store_rows[t] = &gauge(registry_, AgentMetric::kStoreRows, table);
  }
}

}  // namespace gaugewatch::agent
