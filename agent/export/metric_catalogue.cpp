#include "agent/export/metric_catalogue.h"

namespace gaugewatch::agent {

namespace {

std::vector<ExportedMetric> build() {
  std::vector<ExportedMetric> out;
  for (const auto& spec : reference::metric_catalogue()) {
    // Base units: a dimensionless ratio carries the _ratio suffix; norms and
    // logits are in the units of the activations and carry none.
    const bool ratio = spec.unit == "ratio";
    out.push_back({"gaugewatch_layer_" + std::string(spec.name) + (ratio ? "_ratio" : ""),
                   MetricType::kGauge, ratio ? "ratio" : "",
                   std::string(spec.help) + " Latest audited sample.", "run,rank,layer"});
  }
  for (const auto& row : kAgentMetricRows) {
    out.push_back({std::string(row.name), row.type, std::string(row.unit), std::string(row.help),
                   std::string(row.labels)});
  }
  return out;
}

}  // namespace

const std::vector<ExportedMetric>& exported_catalogue() {
  static const std::vector<ExportedMetric> catalogue = build();
  return catalogue;
}

const ExportedMetric& layer_metric(reference::MetricId id) {
  return exported_catalogue()[static_cast<std::size_t>(id)];
}

const ExportedMetric& agent_metric(AgentMetric id) {
  return exported_catalogue()[reference::kMetricCount + static_cast<std::size_t>(id)];
}

}  // namespace gaugewatch::agent
