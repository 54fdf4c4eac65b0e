#include "agent/export/state_collector.h"

#include <string>

#include "agent/export/layer_series_text.h"
#include "agent/export/metric_catalogue.h"

namespace gaugewatch::agent {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using Labels = std::vector<ClientMetric::Label>;

prometheus::MetricType family_type(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return prometheus::MetricType::Counter;
    case MetricType::kHistogram: return prometheus::MetricType::Histogram;
    case MetricType::kGauge:
    case MetricType::kInfo: break;  // an info metric is a gauge of value 1 in text 0.0.4
  }
  return prometheus::MetricType::Gauge;
}

MetricFamily family(const ExportedMetric& metric) {
  MetricFamily out;
  out.name = metric.name;
  out.help = metric.help;
  out.type = family_type(metric.type);
  return out;
}

void add(MetricFamily& family, Labels labels, double value) {
  ClientMetric metric;
  metric.label = std::move(labels);
  if (family.type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
}

struct RankSnap {
  Labels labels;  // run, rank
  bool connected;
  bool expired;
  bool finished;
  Labels info;  // run, rank and the process's identity
  double last_seen_seconds;
  std::uint64_t hook_dropped;
  std::uint64_t samples_shed;
  std::uint64_t step;
  std::vector<AttentionCalls> attention_calls;
};

}  // namespace

std::vector<MetricFamily> StateCollector::Collect() const {
  // Snapshot first: each rank is locked once, briefly.
  std::vector<RankSnap> ranks;
  std::size_t retained = 0;
  for (const auto& entry : registry_.ranks()) {
    ++retained;
    std::lock_guard lock(entry->mu);
    if (!entry->exported) continue;
    RankSnap rank;
    rank.labels = {{"run", entry->run_id}, {"rank", std::to_string(entry->rank)}};
    rank.connected = entry->connected;
    rank.expired = entry->expired;
    rank.finished = entry->finished;
    const auto& hello = entry->hello;
    rank.info = rank.labels;
    rank.info.push_back({"local_rank", std::to_string(hello.local_rank())});
    rank.info.push_back({"hostname", hello.host()});
    rank.info.push_back({"gpu_uuid", hello.gpu_uuid()});
    rank.info.push_back({"pci_bus_id", hello.pci_bus_id()});
    rank.last_seen_seconds = static_cast<double>(entry->last_seen_unix_ns) / 1e9;
    rank.hook_dropped = entry->hook_dropped;
    rank.samples_shed = entry->samples_shed;
    rank.step = entry->current_step;
    rank.attention_calls = entry->attention_calls;
    ranks.push_back(std::move(rank));
  }

  std::vector<MetricFamily> out;
  out.reserve(16);
  const auto per_rank = [&](AgentMetric id, auto value) {
    auto& metric = out.emplace_back(family(agent_metric(id)));
    for (const auto& rank : ranks) add(metric, rank.labels, value(rank));
  };
  per_rank(AgentMetric::kRankConnected, [](const RankSnap& r) { return r.connected ? 1.0 : 0.0; });
  per_rank(AgentMetric::kRankExpired, [](const RankSnap& r) { return r.expired ? 1.0 : 0.0; });
  per_rank(AgentMetric::kRankFinished, [](const RankSnap& r) { return r.finished ? 1.0 : 0.0; });
  {
    auto& metric = out.emplace_back(family(agent_metric(AgentMetric::kRankInfo)));
    for (const auto& rank : ranks) add(metric, rank.info, 1);
  }
  per_rank(AgentMetric::kRankLastSeen, [](const RankSnap& r) { return r.last_seen_seconds; });
  per_rank(AgentMetric::kRankHookDropped,
           [](const RankSnap& r) { return static_cast<double>(r.hook_dropped); });
  per_rank(AgentMetric::kRankSamplesShed,
           [](const RankSnap& r) { return static_cast<double>(r.samples_shed); });
  per_rank(AgentMetric::kRankStep, [](const RankSnap& r) { return static_cast<double>(r.step); });
  {
    auto& metric = out.emplace_back(family(agent_metric(AgentMetric::kRankAttentionCalls)));
    for (const auto& rank : ranks) {
      for (const auto& calls : rank.attention_calls) {
        Labels labels = rank.labels;
        labels.push_back({"monitored", calls.monitored ? "true" : "false"});
        labels.push_back({"reason", calls.reason});
        add(metric, std::move(labels), static_cast<double>(calls.calls_total));
      }
    }
  }
  add(out.emplace_back(family(agent_metric(AgentMetric::kSeries))), {},
      static_cast<double>(registry_.exported_series()));
  add(out.emplace_back(family(agent_metric(AgentMetric::kSeriesLimit))), {},
      static_cast<double>(registry_.max_series()));
  add(out.emplace_back(family(agent_metric(AgentMetric::kSeriesRefused))), {},
      static_cast<double>(registry_.series_refused()));
  add(out.emplace_back(family(agent_metric(AgentMetric::kRanksRetained))), {},
      static_cast<double>(retained));
  return out;
}

void StateCollector::append_layer_series(std::string& out) const {
  gaugewatch::agent::append_layer_series(registry_, out);
}

}  // namespace gaugewatch::agent
