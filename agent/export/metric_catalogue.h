#pragma once
// The agent's Prometheus metric catalogue: one table with name, type, unit
// and help for every metric the agent exports. The per-layer metrics are
// generated from the metric table of docs/numerics.md
// (kernels/reference/metric_catalogue), never spelled here; the agent's own
// rows carry their id, and the compiler checks that the rows are in id order
// and complete. Dashboards and rules may use only these names (tests/agent
// checks them).

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/reference/metric_catalogue.h"

namespace gaugewatch::agent {

enum class MetricType { kGauge, kCounter, kInfo, kHistogram };

// Metrics after the per-layer ones, in catalogue order.
enum class AgentMetric : std::size_t {
  kLayerBackendInfo,
  kLayerSamples,
  kRankConnected,
  kRankExpired,
  kRankLastSeen,
  kRankHookDropped,
  kRankSamplesShed,
  kRankAttentionCalls,
  kRankFinished,
  kRankInfo,
  kBuildInfo,
  kStartTime,
  kTrainersConnected,
  kConnections,
  kSamplesReceived,
  kSamplesRejected,
  kSamplesDropped,
  kCommandsDropped,
  kMessagesRejected,
  kCommandsSent,
  kSwitches,
  kCommandAcks,
  kDecisions,
  kRuleEvaluations,
  kRuleFirings,
  kEscalationsUncorrectable,
  kPromqlQueries,
  kPromqlErrors,
  kStoreErrors,
  kSeries,
  kSeriesLimit,
  kSeriesRefused,
  kRanksExpired,
  kRanksRetained,
  kScrapes,
  kScrapeDuration,
  kSampleAge,
  kSampleClockSkew,
  kSamplesShed,
  kStreamsRefused,
  kStorePrunedRows,
  kStoreRows,
  kRetentionRuns,
  kStreamsUnauthenticated,
  kCount,
};
inline constexpr std::size_t kAgentMetricCount = static_cast<std::size_t>(AgentMetric::kCount);

struct AgentMetricRow {
  AgentMetric id;
  std::string_view name;  // full sample name: counters end in _total, info in _info
  MetricType type;
  std::string_view unit;  // "" = none; else the name ends in _<unit>
  std::string_view help;
  std::string_view labels;  // label names, comma separated, for documentation
};

// clang-format off
inline constexpr std::array<AgentMetricRow, kAgentMetricCount> kAgentMetricRows = {{
  {AgentMetric::kLayerBackendInfo, "gaugewatch_layer_backend_info", MetricType::kInfo, "",
   "Backend a layer runs (backend) and the one decisions ask for (desired).",
   "run,rank,layer,name,backend,desired"},
  {AgentMetric::kLayerSamples, "gaugewatch_layer_samples_total", MetricType::kCounter, "",
   "Audited samples received for a layer.", "run,rank,layer"},
  {AgentMetric::kRankConnected, "gaugewatch_rank_connected", MetricType::kGauge, "",
   "1 while the rank's trainer has a stream open.", "run,rank"},
  {AgentMetric::kRankExpired, "gaugewatch_rank_expired", MetricType::kGauge, "",
   "1 once the rank sent nothing for the expiry time; its layer series are dropped.", "run,rank"},
  {AgentMetric::kRankLastSeen, "gaugewatch_rank_last_seen_timestamp_seconds", MetricType::kGauge,
   "seconds", "Unix time of the rank's last message.", "run,rank"},
  {AgentMetric::kRankHookDropped, "gaugewatch_rank_hook_dropped_samples_total",
   MetricType::kCounter, "", "Samples the rank's hook dropped from its bounded queue.", "run,rank"},
  {AgentMetric::kRankSamplesShed, "gaugewatch_rank_samples_shed_total", MetricType::kCounter, "",
   "Valid samples of the rank the agent discarded (its stream's rate limit).", "run,rank"},
  {AgentMetric::kRankAttentionCalls, "gaugewatch_rank_attention_calls_total",
   MetricType::kCounter, "",
   "Attention calls the rank's hook saw, by whether it monitored them and why not "
   "(reasons as the hook reports them, bounded).",
   "run,rank,monitored,reason"},
  {AgentMetric::kRankFinished, "gaugewatch_rank_finished", MetricType::kGauge, "",
   "1 once the rank's trainer said goodbye (a clean end): its silence is not a failure.",
   "run,rank"},
  {AgentMetric::kRankInfo, "gaugewatch_rank_info", MetricType::kInfo, "",
   "The rank's process and GPU as its hooks reported them (GPU UUID and PCI bus id as "
   "nvidia-smi and DCGM spell them, empty on CPU): join with DCGM_FI_* on UUID.",
   "run,rank,local_rank,hostname,gpu_uuid,pci_bus_id"},
  {AgentMetric::kBuildInfo, "gaugewatch_agent_build_info", MetricType::kInfo, "",
   "Agent version.", "version"},
  {AgentMetric::kStartTime, "gaugewatch_agent_start_time_seconds", MetricType::kGauge, "seconds",
   "Unix time the agent started.", ""},
  {AgentMetric::kTrainersConnected, "gaugewatch_agent_trainers_connected", MetricType::kGauge, "",
   "Trainer streams open now.", ""},
  {AgentMetric::kConnections, "gaugewatch_agent_connections_total", MetricType::kCounter, "",
   "Trainer streams accepted.", ""},
  {AgentMetric::kSamplesReceived, "gaugewatch_agent_samples_received_total", MetricType::kCounter,
   "", "Samples accepted.", ""},
  {AgentMetric::kSamplesRejected, "gaugewatch_agent_samples_rejected_total", MetricType::kCounter,
   "", "Samples in messages that failed validation.", ""},
  {AgentMetric::kSamplesDropped, "gaugewatch_agent_samples_dropped_total", MetricType::kCounter,
   "", "Samples trainers' hooks reported dropped.", ""},
  {AgentMetric::kCommandsDropped, "gaugewatch_agent_commands_dropped_total", MetricType::kCounter,
   "", "Commands not delivered: stream closed or outbox full.", ""},
  {AgentMetric::kMessagesRejected, "gaugewatch_agent_messages_rejected_total",
   MetricType::kCounter, "", "Trainer messages that failed validation, by reason.", "reason"},
  {AgentMetric::kCommandsSent, "gaugewatch_agent_commands_sent_total", MetricType::kCounter, "",
   "Commands queued to trainers.", ""},
  {AgentMetric::kSwitches, "gaugewatch_agent_switches_total", MetricType::kCounter, "",
   "Backend switch commands queued to trainers.", ""},
  {AgentMetric::kCommandAcks, "gaugewatch_agent_command_acks_total", MetricType::kCounter, "",
   "Command acknowledgements, by status (applied, rejected, unknown: no such command sent).",
   "status"},
  {AgentMetric::kDecisions, "gaugewatch_agent_decisions_total", MetricType::kCounter, "",
   "Switch decisions recorded, by source (admin, rule, promql_rule).", "source"},
  {AgentMetric::kRuleEvaluations, "gaugewatch_agent_rule_evaluations_total", MetricType::kCounter,
   "", "Threshold rule evaluations.", ""},
  {AgentMetric::kRuleFirings, "gaugewatch_agent_rule_firings_total", MetricType::kCounter, "",
   "Threshold rule firings.", ""},
  {AgentMetric::kEscalationsUncorrectable, "gaugewatch_agent_escalations_uncorrectable_total",
   MetricType::kCounter, "",
   "Rule firings on a layer no correcting backend can take (reported, not switched).", ""},
  {AgentMetric::kPromqlQueries, "gaugewatch_agent_promql_queries_total", MetricType::kCounter, "",
   "PromQL rule queries sent.", ""},
  {AgentMetric::kPromqlErrors, "gaugewatch_agent_promql_errors_total", MetricType::kCounter, "",
   "PromQL rule queries that failed.", ""},
  {AgentMetric::kStoreErrors, "gaugewatch_agent_store_errors_total", MetricType::kCounter, "",
   "SQLite writes that failed.", ""},
  {AgentMetric::kSeries, "gaugewatch_agent_series", MetricType::kGauge, "",
   "Per-layer and per-rank series admitted by the cardinality guard.", ""},
  {AgentMetric::kSeriesLimit, "gaugewatch_agent_series_limit", MetricType::kGauge, "",
   "Cardinality guard limit (max_series).", ""},
  {AgentMetric::kSeriesRefused, "gaugewatch_agent_series_refused_total", MetricType::kCounter, "",
   "Layers or ranks whose series the cardinality guard refused.", ""},
  {AgentMetric::kRanksExpired, "gaugewatch_agent_ranks_expired_total", MetricType::kCounter, "",
   "Ranks expired for silence.", ""},
  {AgentMetric::kRanksRetained, "gaugewatch_agent_ranks", MetricType::kGauge, "",
   "Ranks the agent holds in memory (connected, expired or finished, not yet forgotten).", ""},
  {AgentMetric::kScrapes, "gaugewatch_agent_scrapes_total", MetricType::kCounter, "",
   "Scrapes of /metrics.", ""},
  {AgentMetric::kScrapeDuration, "gaugewatch_agent_scrape_duration_seconds", MetricType::kGauge,
   "seconds", "Time the previous /metrics rendering took.", ""},
  {AgentMetric::kSampleAge, "gaugewatch_agent_sample_age_seconds", MetricType::kHistogram,
   "seconds", "Time from a trainer stamping a sample to the agent applying it.", "le"},
  {AgentMetric::kSampleClockSkew, "gaugewatch_agent_samples_clock_skew_total",
   MetricType::kCounter, "",
   "Samples whose unix_time_ns lies outside the clock-skew window (max_clock_skew_seconds); "
   "their age is not observed.",
   ""},
  {AgentMetric::kSamplesShed, "gaugewatch_agent_samples_shed_total", MetricType::kCounter, "",
   "Valid samples the agent discarded, by reason (rate_limit: a trainer stream over "
   "trainer_sample_rate).",
   "reason"},
  {AgentMetric::kStreamsRefused, "gaugewatch_agent_streams_refused_total", MetricType::kCounter,
   "",
   "Trainer streams refused or ended by a limit, by reason (stream_limit, rank_limit, "
   "hello_deadline).",
   "reason"},
  {AgentMetric::kStorePrunedRows, "gaugewatch_agent_store_pruned_rows_total",
   MetricType::kCounter, "", "SQLite rows deleted by retention, by table (audit, decisions).",
   "table"},
  {AgentMetric::kStoreRows, "gaugewatch_agent_store_rows", MetricType::kGauge, "",
   "SQLite rows after the last retention pass, by table (audit, decisions).", "table"},
  {AgentMetric::kRetentionRuns, "gaugewatch_agent_retention_runs_total", MetricType::kCounter, "",
   "Retention passes over the SQLite store.", ""},
  {AgentMetric::kStreamsUnauthenticated, "gaugewatch_agent_hook_streams_unauthenticated_total",
   MetricType::kCounter, "",
   "Trainer streams over TCP refused for a missing or wrong bearer token.", ""},
}};
// clang-format on

constexpr bool agent_rows_in_id_order() {
  for (std::size_t i = 0; i < kAgentMetricRows.size(); ++i) {
    if (static_cast<std::size_t>(kAgentMetricRows[i].id) != i) return false;
  }
  return true;
}
static_assert(agent_rows_in_id_order(), "kAgentMetricRows: row i must carry AgentMetric id i");

struct ExportedMetric {
  std::string name;
  MetricType type;
  std::string unit;
  std::string help;
  std::string labels;
};

// Layer metrics first (indexed by reference::MetricId), then AgentMetric.
const std::vector<ExportedMetric>& exported_catalogue();
const ExportedMetric& layer_metric(reference::MetricId id);
const ExportedMetric& agent_metric(AgentMetric id);

}  // namespace gaugewatch::agent
