#include "agent/export/exposition.h"

#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "agent/export/metric_catalogue.h"

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;

v1::Hello hello(const std::string& run, std::uint32_t rank, int layers) {
  v1::Hello h;
  h.set_protocol_version(v1::PROTOCOL_VERSION_1);
  h.set_run_id(run);
  h.set_rank(rank);
  h.set_world_size(rank + 1);
  for (int i = 0; i < layers; ++i) {
    auto* layer = h.add_layers();
    layer->set_index(static_cast<std::uint32_t>(i));
    layer->set_name(i == 0 ? "attn \"q\\k\"" : "attn." + std::to_string(i));
    layer->set_backend(v1::BACKEND_STOCK);
  }
  return h;
}

void record(RunRegistry& registry, RankEntry& rank, std::size_t layer, double dq) {
  std::lock_guard lock(rank.mu);
  auto& entry = rank.layers[layer];
  v1::LayerMetrics metrics;
  metrics.set_live_dq_discrepancy(dq);
  metrics.set_key_rms(12.5);
  entry.latest = to_values(metrics);
  entry.samples += 1;
  registry.admit(entry);
}

TEST(MetricCatalogue, NamesComeFromTheReferenceTable) {
  const auto& catalogue = exported_catalogue();
  std::set<std::string> names;
  for (const auto& metric : catalogue) {
    EXPECT_TRUE(std::regex_match(metric.name, std::regex("gaugewatch_[a-z0-9_]+"))) << metric.name;
    EXPECT_TRUE(names.insert(metric.name).second) << "duplicate " << metric.name;
    if (metric.type == MetricType::kCounter) {
      EXPECT_TRUE(metric.name.ends_with("_total")) << metric.name;
    }
    if (!metric.unit.empty()) {
      EXPECT_TRUE(metric.name.ends_with("_" + metric.unit)) << metric.name;
    }
    EXPECT_FALSE(metric.help.empty());
  }
  for (const auto& spec : reference::metric_catalogue()) {
    const auto& metric = layer_metric(spec.id);
    EXPECT_EQ(metric.name.find("gaugewatch_layer_" + std::string(spec.name)), 0u);
  }
  EXPECT_EQ(layer_metric(reference::MetricId::kLiveDqDiscrepancy).name,
            "gaugewatch_layer_live_dq_discrepancy_ratio");
  EXPECT_EQ(family_name(agent_metric(AgentMetric::kSamplesReceived)),
            "gaugewatch_agent_samples_received");
}

TEST(Exposition, PrometheusTextAndOpenMetrics) {
  RunRegistry registry(1000, 0);
  AgentCounters counters;
  counters.samples_received_total = 7;
  auto rank = registry.connect(hello("run-a", 1, 2), 1);
  record(registry, *rank, 0, 0.25);
  const std::string text =
      render_metrics({registry, counters, 1700000000.0}, ExpositionFormat::kPrometheusText);
  EXPECT_NE(text.find("# TYPE gaugewatch_layer_live_dq_discrepancy_ratio gauge\n"),
            std::string::npos);
  EXPECT_NE(text.find("gaugewatch_layer_live_dq_discrepancy_ratio{run=\"run-a\",rank=\"1\","
                      "layer=\"0\"} 0.25\n"),
            std::string::npos);
  // The layer name is escaped: quote and backslash.
  EXPECT_NE(text.find("name=\"attn \\\"q\\\\k\\\"\""), std::string::npos) << text;
  EXPECT_NE(text.find("gaugewatch_agent_samples_received_total 7\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE gaugewatch_agent_samples_received_total counter"), std::string::npos);
  EXPECT_EQ(text.find("# EOF"), std::string::npos);
  // Layer 1 never sent a sample: no series.
  EXPECT_EQ(text.find("layer=\"1\""), std::string::npos);

  const std::string om =
      render_metrics({registry, counters, 1700000000.0}, ExpositionFormat::kOpenMetrics);
  EXPECT_NE(om.find("# TYPE gaugewatch_agent_samples_received counter\n"), std::string::npos);
  EXPECT_NE(om.find("gaugewatch_agent_samples_received_total 7\n"), std::string::npos);
  EXPECT_NE(om.find("# UNIT gaugewatch_layer_live_dq_discrepancy_ratio ratio\n"), std::string::npos);
  EXPECT_NE(om.find("# TYPE gaugewatch_agent_build info\n"), std::string::npos);
  EXPECT_TRUE(om.ends_with("# EOF\n"));
}

TEST(Exposition, Negotiation) {
  EXPECT_EQ(negotiate(""), ExpositionFormat::kPrometheusText);
  EXPECT_EQ(negotiate("text/plain;version=0.0.4;q=0.3,*/*;q=0.2"), ExpositionFormat::kPrometheusText);
  EXPECT_EQ(negotiate("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
            ExpositionFormat::kOpenMetrics);
  std::string out;
  append_escaped_label(out, "a\\b\"c\nd");
  EXPECT_EQ(out, "a\\\\b\\\"c\\nd");
}

TEST(Exposition, CardinalityGuardRefusesAndCounts) {
  // Room for exactly two layers' series.
  RunRegistry registry(2 * RunRegistry::kSeriesPerLayer, 0);
  auto rank = registry.connect(hello("run-b", 0, 4), 1);
  for (std::size_t layer = 0; layer < 4; ++layer) record(registry, *rank, layer, 0.1);
  EXPECT_EQ(registry.exported_series(), 2 * RunRegistry::kSeriesPerLayer);
  EXPECT_EQ(registry.series_refused(), 2u);
  AgentCounters counters;
  const std::string text =
      render_metrics({registry, counters, 0.0}, ExpositionFormat::kPrometheusText);
  EXPECT_EQ(text.find("layer=\"2\""), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_series_refused_total 2\n"), std::string::npos);
  // Expiry gives the series back.
  EXPECT_EQ(registry.expire(rank->last_seen_steady_ns + 10, 1), 1u);
  EXPECT_EQ(registry.exported_series(), 0u);
  // Connected ranks are kept however long they are silent...
  registry.expire(rank->last_seen_steady_ns + 100, 1);
  EXPECT_EQ(registry.ranks().size(), 1u);
  // ...disconnected ones are forgotten after 10x the expiry time.
  registry.disconnect(*rank, 1);
  registry.expire(rank->last_seen_steady_ns + 5, 1);
  EXPECT_EQ(registry.ranks().size(), 1u);
  registry.expire(rank->last_seen_steady_ns + 100, 1);
  EXPECT_TRUE(registry.ranks().empty());
}

}  // namespace
}  // namespace gaugewatch::agent
