#pragma once
// The /metrics body: every collectable's families serialized by
// prometheus-cpp's TextSerializer (Prometheus text format 0.0.4).

#include <string>
#include <string_view>
#include <vector>

#include <prometheus/collectable.h>

namespace gaugewatch::agent {

inline constexpr std::string_view kExpositionContentType = "text/plain; version=0.0.4; charset=utf-8";

std::string render_metrics(const std::vector<const prometheus::Collectable*>& sources);

}  // namespace gaugewatch::agent
