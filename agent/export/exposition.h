#pragma once
// Renders the agent's state and self-metrics in the Prometheus text format
// 0.0.4 or OpenMetrics 1.0.0, from the one catalogue (metric_catalogue.h).

#include <string>
#include <string_view>

#include "agent/state/agent_counters.h"
#include "agent/state/run_registry.h"

namespace gaugewatch::agent {

enum class ExpositionFormat { kPrometheusText, kOpenMetrics };

// OpenMetrics when the Accept header asks for application/openmetrics-text.
ExpositionFormat negotiate(std::string_view accept_header);
std::string_view content_type(ExpositionFormat format);

// Escapes a label value: backslash, double quote and newline.
void append_escaped_label(std::string& out, std::string_view value);

struct ExpositionInput {
  const RunRegistry& registry;
  const AgentCounters& counters;
  double start_time_seconds;
};

std::string render_metrics(const ExpositionInput& input, ExpositionFormat format);

}  // namespace gaugewatch::agent
