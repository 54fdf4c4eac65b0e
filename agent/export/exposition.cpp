#include "agent/export/exposition.h"

#include <charconv>
#include <cmath>
#include <vector>

#include "agent/common/backend_names.h"
#include "agent/export/metric_catalogue.h"

namespace gaugewatch::agent {

namespace {

struct LayerSnap {
  std::string labels;  // run="..",rank="..",layer=".."
  std::string name;
  gaugewatch::v1::Backend backend;
  gaugewatch::v1::Backend desired;
  std::uint64_t samples;
  MetricValues latest;
};

struct RankSnap {
  std::string labels;  // run="..",rank=".."
  bool connected;
  bool expired;
  double last_seen_seconds;
  std::uint64_t hook_dropped;
  std::uint64_t samples_shed;
};

void append_number(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
  } else if (std::isinf(value)) {
    out += value > 0 ? "+Inf" : "-Inf";
  } else {
    char buffer[32];
    auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
    out.append(buffer, result.ptr);
  }
}

void append_uint(std::string& out, std::uint64_t value) {
  char buffer[24];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, result.ptr);
}

void append_help_escaped(std::string& out, std::string_view text, bool openmetrics) {
  for (char ch : text) {
    if (ch == '\\') {
      out += "\\\\";
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '"' && openmetrics) {
      out += "\\\"";
    } else {
      out += ch;
    }
  }
}

class Writer {
 public:
  Writer(std::string& out, ExpositionFormat format)
      : out_(out), openmetrics_(format == ExpositionFormat::kOpenMetrics) {}

  void header(const ExportedMetric& metric) {
    const std::string_view family = openmetrics_ ? family_name(metric) : metric.name;
    out_ += "# HELP ";
    out_ += family;
    out_ += ' ';
    append_help_escaped(out_, metric.help, openmetrics_);
    out_ += "\n# TYPE ";
    out_ += family;
    switch (metric.type) {
      case MetricType::kGauge: out_ += " gauge\n"; break;
      case MetricType::kCounter: out_ += " counter\n"; break;
      case MetricType::kInfo: out_ += openmetrics_ ? " info\n" : " gauge\n"; break;
      case MetricType::kHistogram: out_ += " histogram\n"; break;
    }
    if (openmetrics_ && !metric.unit.empty()) {
      out_ += "# UNIT ";
      out_ += family;
      out_ += ' ';
      out_ += metric.unit;
      out_ += '\n';
    }
  }

  // name{labels} value
  void sample(const ExportedMetric& metric, std::string_view labels, double value) {
    series(metric, labels);
    append_number(out_, value);
    out_ += '\n';
  }

  void sample_u(const ExportedMetric& metric, std::string_view labels, std::uint64_t value) {
    series(metric, labels);
    append_uint(out_, value);
    out_ += '\n';
  }

  // "name{labels} ": what every sample line starts with.
  void series(const ExportedMetric& metric, std::string_view labels) {
    out_ += metric.name;
    if (!labels.empty()) {
      out_ += '{';
      out_ += labels;
      out_ += '}';
    }
    out_ += ' ';
  }

  // name_suffix{labels} value, for histogram parts.
  void sample_suffix(const ExportedMetric& metric, std::string_view suffix, std::string_view labels,
                     double value) {
    out_ += metric.name;
    out_ += suffix;
    if (!labels.empty()) {
      out_ += '{';
      out_ += labels;
      out_ += '}';
    }
    out_ += ' ';
    append_number(out_, value);
    out_ += '\n';
  }

  void finish() {
    if (openmetrics_) out_ += "# EOF\n";
  }

 private:
  std::string& out_;
  bool openmetrics_;
};

std::string label(std::string_view name, std::string_view value) {
  std::string out(name);
  out += "=\"";
  append_escaped_label(out, value);
  out += '"';
  return out;
}

}  // namespace

ExpositionFormat negotiate(std::string_view accept) {
  return accept.find("application/openmetrics-text") != std::string_view::npos
             ? ExpositionFormat::kOpenMetrics
             : ExpositionFormat::kPrometheusText;
}

std::string_view content_type(ExpositionFormat format) {
  return format == ExpositionFormat::kOpenMetrics
             ? "application/openmetrics-text; version=1.0.0; charset=utf-8"
             : "text/plain; version=0.0.4; charset=utf-8";
}

void append_escaped_label(std::string& out, std::string_view value) {
  for (char ch : value) {
    if (ch == '\\') {
      out += "\\\\";
    } else if (ch == '"') {
      out += "\\\"";
    } else if (ch == '\n') {
      out += "\\n";
    } else {
      out += ch;
    }
  }
}

std::string render_metrics(const ExpositionInput& input, ExpositionFormat format) {
  // Snapshot first: each rank is locked once, briefly.
  std::vector<RankSnap> ranks;
  std::vector<LayerSnap> layers;
  for (const auto& entry : input.registry.ranks()) {
    std::lock_guard lock(entry->mu);
    RankSnap rank;
    rank.labels = label("run", entry->run_id) + "," + label("rank", std::to_string(entry->rank));
    rank.connected = entry->connected;
    rank.expired = entry->expired;
    rank.last_seen_seconds = static_cast<double>(entry->last_seen_unix_ns) / 1e9;
    rank.hook_dropped = entry->hook_dropped;
    rank.samples_shed = entry->samples_shed;
    for (std::size_t i = 0; i < entry->layers.size(); ++i) {
      const auto& layer = entry->layers[i];
      if (!layer.exported) continue;
      LayerSnap snap;
      snap.labels = rank.labels + ",layer=\"" + std::to_string(i) + "\"";
      snap.name = layer.name;
      snap.backend = layer.backend;
      snap.desired = layer.desired;
      snap.samples = layer.samples;
      snap.latest = layer.latest;
      layers.push_back(std::move(snap));
    }
    ranks.push_back(std::move(rank));
  }

  std::string out;
  out.reserve(256 + layers.size() * 22 * 96);
  Writer w(out, format);
  for (std::size_t m = 0; m < reference::kMetricCount; ++m) {
    const auto& metric = layer_metric(static_cast<reference::MetricId>(m));
    w.header(metric);
    for (const auto& layer : layers) {
      if (layer.latest.present.test(m)) w.sample(metric, layer.labels, layer.latest.value[m]);
    }
  }
  {
    const auto& metric = agent_metric(AgentMetric::kLayerBackendInfo);
    w.header(metric);
    for (const auto& layer : layers) {
      std::string labels = layer.labels + "," + label("name", layer.name) + "," +
                           label("backend", backend_name(layer.backend)) + "," +
                           label("desired", backend_name(layer.desired));
      w.sample_u(metric, labels, 1);
    }
  }
  {
    const auto& metric = agent_metric(AgentMetric::kLayerSamples);
    w.header(metric);
    for (const auto& layer : layers) w.sample_u(metric, layer.labels, layer.samples);
  }
  const auto per_rank = [&](AgentMetric id, auto value) {
    const auto& metric = agent_metric(id);
    w.header(metric);
    for (const auto& rank : ranks) w.sample(metric, rank.labels, value(rank));
  };
  per_rank(AgentMetric::kRankConnected, [](const RankSnap& r) { return r.connected ? 1.0 : 0.0; });
  per_rank(AgentMetric::kRankExpired, [](const RankSnap& r) { return r.expired ? 1.0 : 0.0; });
  per_rank(AgentMetric::kRankLastSeen, [](const RankSnap& r) { return r.last_seen_seconds; });
  per_rank(AgentMetric::kRankHookDropped,
           [](const RankSnap& r) { return static_cast<double>(r.hook_dropped); });
  per_rank(AgentMetric::kRankSamplesShed,
           [](const RankSnap& r) { return static_cast<double>(r.samples_shed); });

  const auto& c = input.counters;
  const auto single = [&](AgentMetric id, double value) {
    const auto& metric = agent_metric(id);
    w.header(metric);
    w.sample(metric, "", value);
  };
  const auto single_u = [&](AgentMetric id, std::uint64_t value) {
    const auto& metric = agent_metric(id);
    w.header(metric);
    w.sample_u(metric, "", value);
  };
  {
    const auto& metric = agent_metric(AgentMetric::kBuildInfo);
    w.header(metric);
    w.sample_u(metric, label("version", kAgentVersion), 1);
  }
  single(AgentMetric::kStartTime, input.start_time_seconds);
  single(AgentMetric::kTrainersConnected, static_cast<double>(c.trainers_connected.load()));
  single_u(AgentMetric::kConnections, c.connections_total.load());
  single_u(AgentMetric::kSamplesReceived, c.samples_received_total.load());
  single_u(AgentMetric::kSamplesRejected, c.samples_rejected_total.load());
  single_u(AgentMetric::kSamplesDropped, c.hook_dropped_total.load());
  single_u(AgentMetric::kCommandsDropped, c.commands_dropped_total.load());
  {
    const auto& metric = agent_metric(AgentMetric::kMessagesRejected);
    w.header(metric);
    for (std::size_t r = 1; r < kRejectReasonCount; ++r) {
      w.sample_u(metric, label("reason", reject_reason_name(static_cast<RejectReason>(r))),
                 c.messages_rejected_total[r].load());
    }
  }
  single_u(AgentMetric::kCommandsSent, c.commands_sent_total.load());
  single_u(AgentMetric::kSwitches, c.switch_commands_total.load());
  {
    const auto& metric = agent_metric(AgentMetric::kCommandAcks);
    w.header(metric);
    w.sample_u(metric, label("status", "applied"), c.acks_applied_total.load());
    w.sample_u(metric, label("status", "rejected"), c.acks_rejected_total.load());
    w.sample_u(metric, label("status", "unknown"), c.acks_unknown_total.load());
  }
  {
    const auto& metric = agent_metric(AgentMetric::kDecisions);
    w.header(metric);
    w.sample_u(metric, label("source", "admin"), c.decisions_total[1].load());
    w.sample_u(metric, label("source", "rule"), c.decisions_total[2].load());
    w.sample_u(metric, label("source", "promql_rule"), c.decisions_total[3].load());
  }
  single_u(AgentMetric::kRuleEvaluations, c.rule_evaluations_total.load());
  single_u(AgentMetric::kRuleFirings, c.rule_firings_total.load());
  single_u(AgentMetric::kPromqlQueries, c.promql_queries_total.load());
  single_u(AgentMetric::kPromqlErrors, c.promql_errors_total.load());
  single_u(AgentMetric::kStoreErrors, c.store_errors_total.load());
  single_u(AgentMetric::kSeries, input.registry.exported_series());
  single_u(AgentMetric::kSeriesLimit, input.registry.max_series());
  single_u(AgentMetric::kSeriesRefused, input.registry.series_refused());
  single_u(AgentMetric::kRanksExpired, c.ranks_expired_total.load());
  single_u(AgentMetric::kScrapes, c.scrapes_total.load());
  single(AgentMetric::kScrapeDuration, static_cast<double>(c.last_scrape_duration_ns.load()) / 1e9);
  {
    const auto& metric = agent_metric(AgentMetric::kSampleAge);
    w.header(metric);
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i <= kSampleAgeBuckets.size(); ++i) {
      cumulative += c.sample_age_bucket[i].load();
      std::string le = "le=\"";
      if (i == kSampleAgeBuckets.size()) {
        le += "+Inf";
      } else {
        append_number(le, kSampleAgeBuckets[i]);
      }
      le += '"';
      w.sample_suffix(metric, "_bucket", le, static_cast<double>(cumulative));
    }
    w.sample_suffix(metric, "_sum", "", static_cast<double>(c.sample_age_sum_ns.load()) / 1e9);
    w.sample_suffix(metric, "_count", "", static_cast<double>(cumulative));
  }
  {
    const auto& metric = agent_metric(AgentMetric::kSamplesShed);
    w.header(metric);
    for (std::size_t r = 0; r < kShedReasonCount; ++r) {
      w.sample_u(metric, label("reason", shed_reason_name(static_cast<ShedReason>(r))),
                 c.samples_shed_total[r].load());
    }
  }
  for (const auto id : {AgentMetric::kStorePrunedRows, AgentMetric::kStoreRows}) {
    const auto& metric = agent_metric(id);
    w.header(metric);
    const auto& values =
        id == AgentMetric::kStorePrunedRows ? c.store_pruned_rows_total : c.store_rows;
    for (std::size_t t = 0; t < kStoreTableCount; ++t) {
      w.sample_u(metric, label("table", store_table_name(static_cast<StoreTable>(t))),
                 values[t].load());
    }
  }
  single_u(AgentMetric::kRetentionRuns, c.retention_runs_total.load());
  single_u(AgentMetric::kStreamsUnauthenticated, c.hook_streams_refused_total.load());
  w.finish();
  return out;
}

}  // namespace gaugewatch::agent
