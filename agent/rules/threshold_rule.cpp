#include "agent/rules/threshold_rule.h"

#include <algorithm>

namespace gaugewatch::agent {

bool rule_applies(const ThresholdRule& rule, const std::string& run_id, std::uint32_t layer) {
  if (!rule.run_id.empty() && rule.run_id != run_id) return false;
  if (!rule.layers.empty() &&
      std::find(rule.layers.begin(), rule.layers.end(), layer) == rule.layers.end()) {
    return false;
  }
  return true;
}

bool step_rule(const ThresholdRule& rule, RuleState& state, double value) {
  const bool greater = rule.op == RuleOp::kGreater;
  if (state.firing) {
    const bool cleared = greater ? value < rule.clear_threshold : value > rule.clear_threshold;
    if (cleared) {
      state.firing = false;
      state.consecutive = 0;
    }
    return false;
  }
  const bool crossing = greater ? value > rule.threshold : value < rule.threshold;
  if (!crossing) {
    state.consecutive = 0;
    return false;
  }
  if (++state.consecutive < rule.for_samples) return false;
  state.consecutive = 0;
  state.firing = true;
  return true;
}

}  // namespace gaugewatch::agent
