#include "agent/rules/threshold_rule.h"

#include <gtest/gtest.h>

namespace gaugewatch::agent {
namespace {

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

}  // namespace
}  // namespace gaugewatch::agent
