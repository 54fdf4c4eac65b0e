#pragma once
// The per-layer families (every catalogue metric's latest value, the layer's
// backend info and its sample count) written straight as Prometheus text
// 0.0.4 from the run registry at scrape time. At 100k series this is most of
// the exposition, and building prometheus-cpp MetricFamily objects for it
// (six label strings per series) and formatting them through TextSerializer's
// ostream cost more than the rest of a scrape; here each layer's label set is
// built once per scrape and values go through std::to_chars. Only layers the
// cardinality guard admitted are written. The agent's own metrics and the
// per-rank series stay on prometheus-cpp (agent/export/state_collector.h).

#include <string>
#include <string_view>

#include "agent/state/run_registry.h"

namespace gaugewatch::agent {

// Appends every per-layer family (# HELP, # TYPE, one line per admitted
// layer that has the value), each family's lines together.
void append_layer_series(const RunRegistry& registry, std::string& out);

// Appends `value` as the text format writes a sample value (shortest
// round-trip decimal; NaN, +Inf, -Inf).
void append_sample_value(double value, std::string& out);

// Appends `text` escaped as a label value (backslash, double quote, newline).
void append_label_value(std::string_view text, std::string& out);

}  // namespace gaugewatch::agent
