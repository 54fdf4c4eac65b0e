#pragma once
// The /metrics body (Prometheus text format 0.0.4): every collectable's
// families and the state's per-rank families serialized by prometheus-cpp's
// TextSerializer, then the state's per-layer families
// (agent/export/layer_series_text.h).

#include <string>
#include <string_view>
#include <vector>

#include <prometheus/collectable.h>

#include "agent/export/state_collector.h"

namespace gaugewatch::agent {

inline constexpr std::string_view kExpositionContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string render_metrics(const std::vector<const prometheus::Collectable*>& sources,
                           const StateCollector& state);

}  // namespace gaugewatch::agent
