#include "agent/export/exposition.h"
#include "agent/export/state_collector.h"
#include "agent/state/agent_counters.h"

#include <gtest/gtest.h>

#include <regex>
#include <set>

#include "agent/export/metric_catalogue.h"
#include "tests/agent/hello_message.h"

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;

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

std::string render(const RunRegistry& registry, const AgentCounters& counters) {
  StateCollector state(registry);
  return render_metrics({&counters.registry()}, state);
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
    if (metric.type == MetricType::kInfo) {
      EXPECT_TRUE(metric.name.ends_with("_info")) << metric.name;
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
  EXPECT_EQ(agent_metric(AgentMetric::kSamplesReceived).name, "gaugewatch_agent_samples_received_total");
}

// Every catalogue name the exposition renders, with its # TYPE line; and
// nothing that is not in the catalogue.
TEST(Exposition, EveryFamilyIsACatalogueRow) {
  RunRegistry registry(1000, 0);
  AgentCounters counters;
  auto rank = registry.connect(hello_message("run-a", 1, 2), 1);
  record(registry, *rank, 0, 0.25);
  const std::string text = render(registry, counters);
  std::set<std::string> typed;
  const std::regex type_line("# TYPE ([a-z0-9_]+) (gauge|counter|histogram)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), type_line); it != std::sregex_iterator(); ++it) {
    typed.insert((*it)[1]);
  }
  for (const auto& metric : exported_catalogue()) {
    EXPECT_TRUE(typed.count(metric.name)) << metric.name << " has no # TYPE line";
  }
  EXPECT_EQ(typed.size(), exported_catalogue().size());
}

TEST(Exposition, PrometheusText) {
  RunRegistry registry(1000, 0);
  AgentCounters counters;
  counters.samples_received_total.Increment(7);
  auto rank = registry.connect(hello_message("run-a", 1, 2), 1);
  record(registry, *rank, 0, 0.25);
  const std::string text = render(registry, counters);
  EXPECT_NE(text.find("# TYPE gaugewatch_layer_live_dq_discrepancy_ratio gauge\n"),
            std::string::npos);
  EXPECT_NE(text.find("gaugewatch_layer_live_dq_discrepancy_ratio{run=\"run-a\",rank=\"1\","
                      "layer=\"0\"} 0.25\n"),
            std::string::npos) << text;
  // The layer name is escaped: quote and backslash.
  EXPECT_NE(text.find("name=\"attn \\\"q\\\\k\\\"\""), std::string::npos) << text;
  EXPECT_NE(text.find("gaugewatch_agent_samples_received_total 7\n"), std::string::npos);
  EXPECT_NE(text.find("# TYPE gaugewatch_agent_samples_received_total counter"), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_build_info{version=\""), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_rank_connected{run=\"run-a\",rank=\"1\"} 1\n"), std::string::npos);
  // Layer 1 never sent a sample: no series.
  EXPECT_EQ(text.find("layer=\"1\""), std::string::npos);
}

TEST(Exposition, SampleAgeHistogramIsCumulative) {
  AgentCounters counters;
  SampleAgeBatch batch;
  batch.add(50'000);          // 50 us
  batch.add(2'000'000'000);   // 2 s
  batch.add(-5);              // clamped to 0
  counters.observe(batch);
  RunRegistry registry(10, 0);
  const std::string text = render(registry, counters);
  EXPECT_NE(text.find("gaugewatch_agent_sample_age_seconds_bucket{le=\"0.0001\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gaugewatch_agent_sample_age_seconds_bucket{le=\"2.5\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_sample_age_seconds_count 3\n"), std::string::npos);
}

TEST(Exposition, CardinalityGuardRefusesAndCounts) {
  // Room for the rank's own series and exactly two layers' series.
  RunRegistry registry(RunRegistry::kSeriesPerRank + 2 * RunRegistry::kSeriesPerLayer, 0);
  auto rank = registry.connect(hello_message("run-b", 0, 4), 1);
  for (std::size_t layer = 0; layer < 4; ++layer) record(registry, *rank, layer, 0.1);
  EXPECT_EQ(registry.exported_series(), RunRegistry::kSeriesPerRank + 2 * RunRegistry::kSeriesPerLayer);
  EXPECT_EQ(registry.series_refused(), 2u);
  AgentCounters counters;
  const std::string text = render(registry, counters);
  EXPECT_EQ(text.find("layer=\"2\""), std::string::npos);
  EXPECT_NE(text.find("gaugewatch_agent_series_refused_total 2\n"), std::string::npos);
  // Expiry gives the layers' series back (the rank's stay: they say it expired).
  EXPECT_EQ(registry.expire(rank->last_seen_steady_ns + 10, 1), 1u);
  EXPECT_EQ(registry.exported_series(), RunRegistry::kSeriesPerRank);
  // Connected ranks are kept however long they are silent...
  registry.expire(rank->last_seen_steady_ns + 100, 1);
  EXPECT_EQ(registry.ranks().size(), 1u);
  // ...disconnected ones are forgotten after 10x the expiry time.
  registry.disconnect(*rank, 1);
  registry.expire(rank->last_seen_steady_ns + 5, 1);
  EXPECT_EQ(registry.ranks().size(), 1u);
  registry.expire(rank->last_seen_steady_ns + 100, 1);
  EXPECT_TRUE(registry.ranks().empty());
  EXPECT_EQ(registry.exported_series(), 0u);
}

// Ranks are inside the guard too: many one-layer ranks cannot push the
// per-rank series past max_series (the attack: 2,000 Hellos made 10,000
// gaugewatch_rank_* series against a limit of 1,000).
TEST(Exposition, RankSeriesAreInsideTheCardinalityGuard) {
  const std::uint64_t limit = 1000;
  RunRegistry registry(limit, 0);
  for (std::uint32_t r = 0; r < 2000; ++r) registry.connect(hello_message("run-c", r, 1), r + 1);
  EXPECT_LE(registry.exported_series(), limit);
  AgentCounters counters;
  const std::string text = render(registry, counters);
  std::size_t rank_series = 0;
  for (std::size_t at = text.find("\ngaugewatch_rank_"); at != std::string::npos;
       at = text.find("\ngaugewatch_rank_", at + 1)) {
    ++rank_series;
  }
  EXPECT_GT(rank_series, 0u);
  EXPECT_LE(rank_series, limit);
  EXPECT_GT(registry.series_refused(), 0u);
}

// Attack: 60 Hellos of 4,096 layers held 246 MiB for 20 minutes. A gone
// rank's layer table is freed as soon as it expires.
TEST(Exposition, ExpiredDisconnectedRanksReleaseTheirLayers) {
  RunRegistry registry(100000, 0);
  auto rank = registry.connect(hello_message("run-m", 0, 4096), 1);
  registry.disconnect(*rank, 1);
  EXPECT_GE(rank->layers.capacity(), 4096u);
  EXPECT_EQ(registry.expire(rank->last_seen_steady_ns + 10, 1), 1u);
  EXPECT_EQ(rank->layers.capacity(), 0u);
  EXPECT_EQ(rank->layer_count, 4096u);  // still known for admin checks
}

TEST(Exposition, RankLimitRefusesNewRanks) {
  RunRegistry registry(100000, 0, 3);
  for (std::uint32_t r = 0; r < 3; ++r) EXPECT_TRUE(registry.connect(hello_message("run-d", r, 1), r + 1));
  EXPECT_FALSE(registry.connect(hello_message("run-d", 3, 1), 9));
  // A known rank may reconnect.
  EXPECT_TRUE(registry.connect(hello_message("run-d", 1, 1), 10));
}

TEST(Exposition, AttentionCallRowsAreBounded) {
  RunRegistry registry(100000, 0);
  auto rank = registry.connect(hello_message("run-e", 0, 1), 1);
  {
    std::lock_guard lock(rank->mu);
    for (int i = 0; i < 20; ++i) {
      v1::AttentionCallCount calls;
      calls.set_monitored(false);
      calls.set_reason("reason_" + std::to_string(i));
      calls.set_calls_total(10);
      RunRegistry::record_attention_calls(*rank, calls);
    }
    EXPECT_EQ(rank->attention_calls.size(), RunRegistry::kMaxAttentionCallRows);
    std::uint64_t total = 0;
    for (const auto& row : rank->attention_calls) total += row.calls_total;
    EXPECT_EQ(total, 200u);
  }
  AgentCounters counters;
  const std::string text = render(registry, counters);
  EXPECT_NE(text.find("gaugewatch_rank_attention_calls_total{run=\"run-e\",rank=\"0\",monitored=\"false\",reason=\"reason_0\"} 10\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("reason=\"other\"} 130\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace gaugewatch::agent
