#pragma once
// Evaluation of one threshold rule on one layer's sample stream: for-N
// consecutive samples past the threshold fires once; the rule re-arms only
// after a sample crosses back past clear_threshold (hysteresis).

#include <cstdint>
#include <string>

#include "agent/config/agent_config.h"
#include "agent/state/run_registry.h"

namespace gaugewatch::agent {

// Whether the rule's scope covers this run and layer.
bool rule_applies(const ThresholdRule& rule, const std::string& run_id, std::uint32_t layer);

// Feeds one value; returns true exactly when the rule fires.
bool step_rule(const ThresholdRule& rule, RuleState& state, double value);

}  // namespace gaugewatch::agent
