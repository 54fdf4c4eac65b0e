#include "agent/rules/threshold_rule.h"

#include <gtest/gtest.h>

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;

TEST(ThresholdRule, FiresAfterNConsecutiveSamples) {
  const ThresholdRule rule = default_dq_rule();
  RuleState state;
  EXPECT_FALSE(step_rule(rule, state, 0.06));
  EXPECT_FALSE(step_rule(rule, state, 0.07));
  EXPECT_FALSE(step_rule(rule, state, 0.01));  // streak broken
  EXPECT_FALSE(step_rule(rule, state, 0.06));
  EXPECT_FALSE(step_rule(rule, state, 0.06));
  EXPECT_TRUE(step_rule(rule, state, 0.06));
  EXPECT_TRUE(state.firing);
}

TEST(ThresholdRule, HysteresisRearmsOnlyBelowClearThreshold) {
  ThresholdRule rule = default_dq_rule();
  rule.for_samples = 1;
  RuleState state;
  EXPECT_TRUE(step_rule(rule, state, 0.2));
  EXPECT_FALSE(step_rule(rule, state, 0.2));   // already firing
  EXPECT_FALSE(step_rule(rule, state, 0.04));  // below threshold, above clear (0.025)
  EXPECT_FALSE(step_rule(rule, state, 0.2));   // still firing: no re-fire
  EXPECT_FALSE(step_rule(rule, state, 0.01));  // cleared
  EXPECT_FALSE(state.firing);
  EXPECT_TRUE(step_rule(rule, state, 0.2));
}

TEST(ThresholdRule, LessThanAndScopes) {
  ThresholdRule rule;
  rule.op = RuleOp::kLess;
  rule.threshold = 1.0;
  rule.clear_threshold = 2.0;
  rule.for_samples = 2;
  RuleState state;
  EXPECT_FALSE(step_rule(rule, state, 0.5));
  EXPECT_TRUE(step_rule(rule, state, 0.5));
  rule.run_id = "r1";
  rule.layers = {2, 4};
  EXPECT_TRUE(rule_applies(rule, "r1", 4));
  EXPECT_FALSE(rule_applies(rule, "r1", 3));
  EXPECT_FALSE(rule_applies(rule, "r2", 2));
  EXPECT_TRUE(rule_applies(default_dq_rule(), "anything", 99));
}

// The rule behind the SampleRule interface: a firing carries the target the
// rule's scope names and the backend escalation chose for the layer.
LayerEntry layer_with(double dq, std::vector<v1::Backend> correcting) {
  LayerEntry layer;
  v1::LayerMetrics metrics;
  metrics.set_live_dq_discrepancy(dq);
  layer.latest = to_values(metrics);
  layer.correcting_backends = std::move(correcting);
  return layer;
}

TEST(ThresholdSampleRule, FiringCarriesTargetAndEscalatedBackend) {
  ThresholdRule config = default_dq_rule();
  config.for_samples = 1;
  const ThresholdSampleRule rule(config);
  const std::string run = "run-a";
  const LayerEntry layer = layer_with(0.2, {v1::BACKEND_CENTER});  // gproj cannot take it; center can
  RuleState state;
  std::vector<RuleFiring> fired;
  EXPECT_TRUE(rule.evaluate({run, 3, 7, 120, layer}, state, fired));
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_TRUE(fired[0].switches);
  EXPECT_EQ(fired[0].backend, v1::BACKEND_CENTER);
  EXPECT_EQ(fired[0].target.run_id(), run);
  EXPECT_EQ(fired[0].target.rank(), 3u);
  ASSERT_EQ(fired[0].target.layers_size(), 1);
  EXPECT_EQ(fired[0].target.layers(0), 7u);
  EXPECT_NE(fired[0].detail.find("at step 120"), std::string::npos) << fired[0].detail;
  EXPECT_NE(fired[0].detail.find("center can"), std::string::npos) << fired[0].detail;
}

TEST(ThresholdSampleRule, NoFiringWhereTheLayerIsAlreadyBound) {
  ThresholdRule config = default_dq_rule();
  config.for_samples = 1;
  const ThresholdSampleRule rule(config);
  const std::string run = "run-a";
  LayerEntry layer = layer_with(0.2, {v1::BACKEND_GPROJ});
  layer.desired = v1::BACKEND_GPROJ;
  RuleState state;
  std::vector<RuleFiring> fired;
  EXPECT_TRUE(rule.evaluate({run, 0, 0, 1, layer}, state, fired));
  EXPECT_TRUE(fired.empty());
  // Metric absent: not evaluated at all.
  const LayerEntry silent;
  EXPECT_FALSE(rule.evaluate({run, 0, 0, 2, silent}, state, fired));
}

TEST(ThresholdSampleRule, UncorrectableLayerIsReportedNotSwitched) {
  ThresholdRule config = default_dq_rule();
  config.for_samples = 1;
  config.decision_scope = DecisionScope::kRun;
  const ThresholdSampleRule rule(config);
  const std::string run = "run-a";
  const LayerEntry layer = layer_with(0.2, {v1::BACKEND_FP32});
  RuleState state;
  std::vector<RuleFiring> fired;
  rule.evaluate({run, 1, 2, 3, layer}, state, fired);
  ASSERT_EQ(fired.size(), 1u);
  EXPECT_TRUE(fired[0].switches);
  EXPECT_EQ(fired[0].backend, v1::BACKEND_UNSPECIFIED);
  EXPECT_FALSE(fired[0].target.has_rank());  // a run-scoped rule targets the whole run
}

}  // namespace
}  // namespace gaugewatch::agent
