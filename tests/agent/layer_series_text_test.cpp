// The per-layer families are written as text by agent/export/layer_series_text
// (a scrape-time fast path, docs/agent.md) instead of through prometheus-cpp.
// This test builds the same families as prometheus-cpp MetricFamily objects
// from the same registry, serializes them with prometheus::TextSerializer and
// asserts that both expositions hold the same families, HELP and TYPE lines
// and samples (names, label sets, values), so the fast path writes exactly
// what the library would.
#include "agent/export/layer_series_text.h"

#include <gtest/gtest.h>
#include <prometheus/client_metric.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "agent/common/backend_names.h"
#include "agent/export/metric_catalogue.h"
#include "tests/agent/hello_message.h"
#include "agent/state/run_registry.h"

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;

void record(RunRegistry& registry, RankEntry& rank, std::size_t layer, double dq, double rms) {
  std::lock_guard lock(rank.mu);
  auto& entry = rank.layers[layer];
  v1::LayerMetrics metrics;
  metrics.set_live_dq_discrepancy(dq);
  metrics.set_key_rms(rms);
  metrics.set_row_mass_abs_max(1.0e-7 / 3.0);
  entry.latest = to_values(metrics);
  entry.samples += 3;
  registry.admit(entry);
}

prometheus::MetricType library_type(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return prometheus::MetricType::Counter;
    case MetricType::kHistogram: return prometheus::MetricType::Histogram;
    case MetricType::kGauge:
    case MetricType::kInfo: break;
  }
  return prometheus::MetricType::Gauge;
}

prometheus::ClientMetric metric(std::vector<prometheus::ClientMetric::Label> labels, double value,
                                prometheus::MetricType type) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

// The per-layer families through prometheus-cpp, from the same registry.
std::string through_library(const RunRegistry& registry) {
  std::vector<prometheus::MetricFamily> families;
  auto family = [&](const ExportedMetric& exported) -> prometheus::MetricFamily& {
    families.push_back({exported.name, exported.help, library_type(exported.type), {}});
    return families.back();
  };
  struct Layer {
    std::vector<prometheus::ClientMetric::Label> labels;
    const LayerEntry* entry;
  };
  std::vector<Layer> layers;
  std::vector<std::shared_ptr<RankEntry>> ranks = registry.ranks();
  for (const auto& rank : ranks) {
    if (!rank->exported) continue;
    for (std::size_t i = 0; i < rank->layers.size(); ++i) {
      if (!rank->layers[i].exported) continue;
      layers.push_back({{{"run", rank->run_id}, {"rank", std::to_string(rank->rank)}, {"layer", std::to_string(i)}},
                        &rank->layers[i]});
    }
  }
  for (std::size_t m = 0; m < reference::kMetricCount; ++m) {
    const auto& exported = layer_metric(static_cast<reference::MetricId>(m));
    auto& f = family(exported);
    for (const auto& layer : layers) {
      if (layer.entry->latest.present.test(m)) {
        f.metric.push_back(metric(layer.labels, layer.entry->latest.value[m], f.type));
      }
    }
  }
  auto& info = family(agent_metric(AgentMetric::kLayerBackendInfo));
  for (const auto& layer : layers) {
    auto labels = layer.labels;
    labels.push_back({"name", layer.entry->name});
    labels.push_back({"backend", std::string(backend_name(layer.entry->backend))});
    labels.push_back({"desired", std::string(backend_name(layer.entry->desired))});
    info.metric.push_back(metric(labels, 1, info.type));
  }
  auto& samples = family(agent_metric(AgentMetric::kLayerSamples));
  for (const auto& layer : layers) {
    samples.metric.push_back(metric(layer.labels, static_cast<double>(layer.entry->samples), samples.type));
  }
  return prometheus::TextSerializer().Serialize(families);
}

// An exposition as comparable parts: comment lines as they are, samples as
// (name and label set) -> value. The two writers may spell a value
// differently (digits, NaN) but must mean the same number.
struct Parsed {
  std::vector<std::string> comments;
  std::map<std::string, double> samples;
};

Parsed parse(const std::string& text) {
  Parsed parsed;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      parsed.comments.push_back(line);
      continue;
    }
    const auto close = line.rfind("} ");
    EXPECT_NE(close, std::string::npos) << line;
    if (close == std::string::npos) continue;
    const std::string key = line.substr(0, close + 1);
    const std::string value = line.substr(close + 2);
    double v = 0;
    if (value == "NaN" || value == "Nan") {
      v = std::numeric_limits<double>::quiet_NaN();
    } else {
      v = std::stod(value);
    }
    EXPECT_TRUE(parsed.samples.emplace(key, v).second) << "duplicate series " << key;
  }
  return parsed;
}

TEST(LayerSeriesText, WritesWhatPrometheusCppsTextSerializerWrites) {
  RunRegistry registry(100000, 0);
  auto a = registry.connect(hello_message("run-a", 0, 3, "attn \"q\\k\"\nnext", v1::BACKEND_GPROJ), 1);
  auto b = registry.connect(hello_message("run \"b\"", 7, 2, "attn \"q\\k\"\nnext", v1::BACKEND_GPROJ), 2);
  record(registry, *a, 0, 0.25, 12.5);
  record(registry, *a, 1, 1.0 / 3.0, 1e-30);
  record(registry, *b, 1, 4.9e9, std::numeric_limits<double>::infinity());
  // a's layer 2 and b's layer 0 never sent a sample: no series in either.

  std::string fast;
  append_layer_series(registry, fast);
  const std::string library = through_library(registry);
  const Parsed x = parse(fast), y = parse(library);
  EXPECT_EQ(x.comments, y.comments);
  ASSERT_EQ(x.samples.size(), y.samples.size()) << fast << "\n----\n" << library;
  EXPECT_GT(x.samples.size(), 3u * 3u);  // three layers, at least three families each
  for (const auto& [series, value] : y.samples) {
    const auto it = x.samples.find(series);
    ASSERT_NE(it, x.samples.end()) << series << " missing from\n" << fast;
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(it->second)) << series;
    } else if (std::isinf(value)) {
      EXPECT_EQ(it->second, value) << series;
    } else {
      // The fast path writes the shortest round-trip digits; TextSerializer
      // 16 significant ones: the same number to the library's precision.
      EXPECT_LE(std::abs(it->second - value), 1e-15 * std::abs(value)) << series;
    }
  }
}

}  // namespace
}  // namespace gaugewatch::agent
