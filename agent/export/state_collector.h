#pragma once
// A prometheus::Collectable that renders the per-layer and per-rank series
// (and the cardinality guard's own gauges) from the run registry at scrape
// time. Only series the guard admitted are rendered, so the exposition never
// holds more than max_series of them however many ranks and layers connect.

#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "agent/state/run_registry.h"

namespace gaugewatch::agent {

class StateCollector : public prometheus::Collectable {
 public:
  explicit StateCollector(const RunRegistry& registry) : registry_(registry) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const RunRegistry& registry_;
};

}  // namespace gaugewatch::agent
