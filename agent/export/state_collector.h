#pragma once
// The series rendered from the run registry at scrape time: a
// prometheus::Collectable for the per-rank series and the cardinality guard's
// own gauges, and the per-layer families written as text
// (agent/export/layer_series_text.h). Only series the guard admitted are
// rendered, so the exposition never holds more than max_series of them
// however many ranks and layers connect.

#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "agent/state/run_registry.h"

namespace gaugewatch::agent {

class StateCollector : public prometheus::Collectable {
 public:
  explicit StateCollector(const RunRegistry& registry) : registry_(registry) {}
  // Per-rank families and the guard's gauges.
  std::vector<prometheus::MetricFamily> Collect() const override;
  // Per-layer families, as Prometheus text.
  void append_layer_series(std::string& out) const;

 private:
  const RunRegistry& registry_;
};

}  // namespace gaugewatch::agent
