#pragma once
// The agent's Prometheus metric catalogue: one table with name, type, unit
// and help for every metric the agent exports. The per-layer metrics are
// generated from the NUMERICS.md table (kernels/reference/metric_catalogue),
// never spelled here; dashboards and rules may use only these names
// (tests/agent checks them).

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/reference/metric_catalogue.h"

namespace gaugewatch::agent {

enum class MetricType { kGauge, kCounter, kInfo, kHistogram };

// Metrics after the per-layer NUMERICS.md ones, in catalogue order.
enum class AgentMetric : std::size_t {
  kLayerBackendInfo,
  kLayerSamples,
  kRankConnected,
  kRankExpired,
  kRankLastSeen,
  kRankHookDropped,
  kRankSamplesShed,
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
  kPromqlQueries,
  kPromqlErrors,
  kStoreErrors,
  kSeries,
  kSeriesLimit,
  kSeriesRefused,
  kRanksExpired,
  kScrapes,
  kScrapeDuration,
  kSampleAge,
  kSamplesShed,
  kStorePrunedRows,
  kStoreRows,
  kRetentionRuns,
  kStreamsUnauthenticated,
  kCount,
};

struct ExportedMetric {
  std::string name;  // full sample name: counters end in _total, info in _info
  MetricType type;
  std::string unit;  // OpenMetrics unit ("" = none); the name ends in _<unit>
  std::string help;
  std::string labels;  // label names, comma separated, for documentation
};

// Layer metrics first (indexed by reference::MetricId), then AgentMetric.
const std::vector<ExportedMetric>& exported_catalogue();
const ExportedMetric& layer_metric(reference::MetricId id);
const ExportedMetric& agent_metric(AgentMetric id);

// Family name for OpenMetrics: the name without _total / _info.
std::string_view family_name(const ExportedMetric& metric);

}  // namespace gaugewatch::agent
