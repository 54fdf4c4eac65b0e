#pragma once
// Evaluation of one threshold rule on one layer's sample stream: for-N
// consecutive samples past the threshold fires once; the rule re-arms only
// after a sample crosses back past clear_threshold (hysteresis). A firing
// of a switch rule carries the backend escalation chooses for the layer
// (agent/rules/escalation.h).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/config/agent_config.h"
#include "agent/rules/rule.h"
#include "agent/state/run_registry.h"

namespace gaugewatch::agent {

// Whether the rule's scope covers this run and layer.
bool rule_applies(const ThresholdRule& rule, const std::string& run_id, std::uint32_t layer);

// Feeds one value; returns true exactly when the rule fires.
bool step_rule(const ThresholdRule& rule, RuleState& state, double value);

class ThresholdSampleRule : public SampleRule {
 public:
  explicit ThresholdSampleRule(ThresholdRule rule) : rule_(std::move(rule)) {}
  const std::string& name() const override { return rule_.name; }
  bool evaluate(const SampleView& sample, RuleState& state, std::vector<RuleFiring>& fired) const override;
  const ThresholdRule& rule() const { return rule_; }

 private:
  const ThresholdRule rule_;
};

// The configuration's threshold rules (effective_rules: the defaults unless
// turned off, then the configured ones), in order: rule i keeps its state in
// LayerEntry::rules[i].
std::vector<std::unique_ptr<SampleRule>> make_sample_rules(const AgentConfig& config);

}  // namespace gaugewatch::agent
