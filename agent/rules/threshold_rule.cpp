#include "agent/rules/threshold_rule.h"

#include <algorithm>
#include <cstdio>

#include "agent/rules/escalation.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

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

bool ThresholdSampleRule::evaluate(const SampleView& sample, RuleState& state,
                                   std::vector<RuleFiring>& fired) const {
  const auto metric = static_cast<std::size_t>(rule_.metric);
  const LayerEntry& layer = sample.state;
  if (!layer.latest.present.test(metric) || !rule_applies(rule_, sample.run_id, sample.layer)) return false;
  const double value = layer.latest.value[metric];
  if (!step_rule(rule_, state, value)) return true;
  Escalation escalation;
  if (rule_.backend != v1::BACKEND_UNSPECIFIED) {
    escalation = choose_backend(rule_.backend, layer.correcting_backends);
    // The layer is on its way to that backend already: nothing to decide.
    if (escalation.backend != v1::BACKEND_UNSPECIFIED && layer.desired == escalation.backend) return true;
  }
  char what[256];
  std::snprintf(what, sizeof what, "rule %s: %s = %.6g at step %llu (threshold %.6g x%u)",
                rule_.name.c_str(), std::string(reference::metric_spec(rule_.metric).name).c_str(), value,
                static_cast<unsigned long long>(sample.step), rule_.threshold, rule_.for_samples);
  RuleFiring& firing = fired.emplace_back();
  firing.rule = rule_.name;
  firing.run_id = sample.run_id;
  firing.rank = sample.rank;
  firing.layer = sample.layer;
  firing.detail = rule_.backend == v1::BACKEND_UNSPECIFIED ? what : std::string(what) + "; " + escalation.why;
  firing.switches = rule_.backend != v1::BACKEND_UNSPECIFIED;
  firing.backend = escalation.backend;
  firing.target.set_run_id(sample.run_id);
  if (rule_.decision_scope == DecisionScope::kRank) firing.target.set_rank(sample.rank);
  firing.target.add_layers(sample.layer);
  firing.capture_count = rule_.capture_count;
  return true;
}

std::vector<std::unique_ptr<SampleRule>> make_sample_rules(const AgentConfig& config) {
  std::vector<std::unique_ptr<SampleRule>> rules;
  for (auto& rule : effective_rules(config)) rules.push_back(std::make_unique<ThresholdSampleRule>(std::move(rule)));
  return rules;
}

}  // namespace gaugewatch::agent
