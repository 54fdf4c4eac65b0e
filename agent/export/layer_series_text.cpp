#include "agent/export/layer_series_text.h"

#include <charconv>
#include <cmath>
#include <string_view>
#include <vector>

#include "agent/common/backend_names.h"
#include "agent/export/metric_catalogue.h"

namespace gaugewatch::agent {

namespace {

// One admitted layer as the scrape saw it, copied under its rank's lock.
struct LayerSnap {
  std::string labels;  // run="...",rank="...",layer="..." (escaped)
  std::string name;
  gaugewatch::v1::Backend backend;
  gaugewatch::v1::Backend desired;
  std::uint64_t samples;
  MetricValues latest;
};

std::vector<LayerSnap> snapshot(const RunRegistry& registry) {
  std::vector<LayerSnap> layers;
  std::string rank_labels;
  for (const auto& entry : registry.ranks()) {
    std::lock_guard lock(entry->mu);
    if (!entry->exported) continue;
    rank_labels.assign("run=\"");
    append_label_value(entry->run_id, rank_labels);
    rank_labels.append("\",rank=\"").append(std::to_string(entry->rank)).append("\",layer=\"");
    for (std::size_t i = 0; i < entry->layers.size(); ++i) {
      const auto& layer = entry->layers[i];
      if (!layer.exported) continue;
      LayerSnap& snap = layers.emplace_back();
      snap.labels.reserve(rank_labels.size() + 8);
      snap.labels.append(rank_labels).append(std::to_string(i)).push_back('"');
      snap.name = layer.name;
      snap.backend = layer.backend;
      snap.desired = layer.desired;
      snap.samples = layer.samples;
      snap.latest = layer.latest;
    }
  }
  return layers;
}

const char* type_name(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kHistogram: return "histogram";
    case MetricType::kGauge:
    case MetricType::kInfo: break;  // an info metric is a gauge of value 1 in text 0.0.4
  }
  return "gauge";
}

void append_header(const ExportedMetric& metric, std::string& out) {
  out.append("# HELP ").append(metric.name).push_back(' ');
  for (const char c : metric.help) {
    if (c == '\\') out.append("\\\\");
    else if (c == '\n') out.append("\\n");
    else out.push_back(c);
  }
  out.append("\n# TYPE ").append(metric.name).push_back(' ');
  out.append(type_name(metric.type)).push_back('\n');
}

// name{labels} value\n
void append_line(const std::string& name, const std::string& labels, double value, std::string& out) {
  out.append(name).push_back('{');
  out.append(labels).append("} ");
  append_sample_value(value, out);
  out.push_back('\n');
}

}  // namespace

void append_sample_value(double value, std::string& out) {
  if (std::isnan(value)) {
    out.append("NaN");
  } else if (std::isinf(value)) {
    out.append(value > 0 ? "+Inf" : "-Inf");
  } else {
    char buffer[32];
    const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
    out.append(buffer, result.ptr);
  }
}

void append_label_value(std::string_view text, std::string& out) {
  for (const char c : text) {
    if (c == '\\') out.append("\\\\");
    else if (c == '"') out.append("\\\"");
    else if (c == '\n') out.append("\\n");
    else out.push_back(c);
  }
}

void append_layer_series(const RunRegistry& registry, std::string& out) {
  const std::vector<LayerSnap> layers = snapshot(registry);
  // About 100 bytes a line: one growth of `out` instead of many.
  out.reserve(out.size() + layers.size() * (reference::kMetricCount + 2) * 100 + 8192);
  for (std::size_t m = 0; m < reference::kMetricCount; ++m) {
    const auto& metric = layer_metric(static_cast<reference::MetricId>(m));
    append_header(metric, out);
    for (const auto& layer : layers) {
      if (layer.latest.present.test(m)) append_line(metric.name, layer.labels, layer.latest.value[m], out);
    }
  }
  {
    const auto& metric = agent_metric(AgentMetric::kLayerBackendInfo);
    append_header(metric, out);
    std::string labels;
    for (const auto& layer : layers) {
      labels.assign(layer.labels).append(",name=\"");
      append_label_value(layer.name, labels);
      labels.append("\",backend=\"").append(backend_name(layer.backend));
      labels.append("\",desired=\"").append(backend_name(layer.desired)).push_back('"');
      append_line(metric.name, labels, 1, out);
    }
  }
  {
    const auto& metric = agent_metric(AgentMetric::kLayerSamples);
    append_header(metric, out);
    for (const auto& layer : layers) {
      append_line(metric.name, layer.labels, static_cast<double>(layer.samples), out);
    }
  }
}

}  // namespace gaugewatch::agent
