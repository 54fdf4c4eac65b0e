#pragma once
// The LayerMetrics proto field of every catalogue metric, looked up by the
// catalogue's name (kernels/reference/metric_catalogue.cpp), so the wire and
// the catalogue cannot drift apart: a missing field throws at first use.

#include <array>
#include <bitset>

#include <google/protobuf/descriptor.h>

#include "gaugewatch/v1/types.pb.h"
#include "kernels/reference/metric_catalogue.h"

namespace gaugewatch::agent {

using MetricFieldTable =
    std::array<const google::protobuf::FieldDescriptor*, reference::kMetricCount>;

// Indexed by MetricId. Throws std::logic_error if a catalogue name has no
// double field in LayerMetrics, or LayerMetrics has a field not in the catalogue.
const MetricFieldTable& metric_fields();

// A compact copy of one LayerMetrics: values and which are set.
struct MetricValues {
  std::array<double, reference::kMetricCount> value{};
  std::bitset<reference::kMetricCount> present;
};

MetricValues to_values(const gaugewatch::v1::LayerMetrics& metrics);
void to_proto(const MetricValues& values, gaugewatch::v1::LayerMetrics& out);

}  // namespace gaugewatch::agent
