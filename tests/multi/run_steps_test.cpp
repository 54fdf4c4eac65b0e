#include "agent/rules/run_steps.h"

#include <gtest/gtest.h>

namespace gaugewatch::agent {
namespace {

constexpr std::int64_t kSecond = 1'000'000'000;

EffectiveStepMargin margin(double delivery_seconds, std::uint64_t lead_steps) {
  EffectiveStepMargin m;
  m.delivery_seconds = delivery_seconds;
  m.lead_steps = lead_steps;
  return m;
}

TEST(RunSteps, ADecisionOfARunWithoutReportsHasNoStep) {
  RunSteps steps(margin(1.0, 2));
  steps.observe("other", 0, 50, 0);
  EXPECT_EQ(steps.begin_decision(1, "run", 0), 0u);
  EXPECT_EQ(steps.effective_step(1), 0u);
}

TEST(RunSteps, OnlyTheRunsOwnRanksCount) {
  RunSteps steps(margin(0.0, 2));
  steps.observe("run", 0, 10, 0);
  steps.observe("run", 1, 12, 0);
  steps.observe("run-b", 0, 900, 0);  // a run whose id extends "run"
  steps.observe("ru", 0, 800, 0);
  EXPECT_EQ(steps.begin_decision(7, "run", 0), 12u + 2 + 1);
  EXPECT_EQ(steps.effective_step(7), 15u);
}

TEST(RunSteps, TheRateOfTheFastestRankSetsTheMargin) {
  RunSteps steps(margin(2.0, 0));
  steps.observe("run", 0, 0, 0);
  steps.observe("run", 0, 10, kSecond);  // 10 steps/s
  steps.observe("run", 1, 0, 0);
  steps.observe("run", 1, 5, kSecond);   // 5 steps/s
  EXPECT_EQ(steps.begin_decision(3, "run", kSecond), 10u + 20 + 1);
}

TEST(RunSteps, OneReissuePerLateStep) {
  RunSteps steps(margin(0.0, 1));
  steps.observe("run", 0, 10, 0);
  steps.observe("run", 1, 10, 0);
  ASSERT_EQ(steps.begin_decision(4, "run", 0), 12u);
  const auto first = steps.reissue(4, "run", 12, 13, 0);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, 13u + 1 + 1);
  EXPECT_EQ(steps.effective_step(4), 15u);
  // A second rank rejecting the same (old) step changes nothing more.
  EXPECT_FALSE(steps.reissue(4, "run", 12, 13, 0).has_value());
  EXPECT_FALSE(steps.reissue(99, "run", 12, 13, 0).has_value());  // unknown decision
}

TEST(RunSteps, AForgottenRankNoLongerHoldsTheStep) {
  RunSteps steps(margin(0.0, 0));
  steps.observe("run", 0, 10, 0);
  steps.observe("run", 1, 500, 0);
  steps.forget("run", 1);
  EXPECT_EQ(steps.begin_decision(1, "run", 0), 11u);
}

}  // namespace
}  // namespace gaugewatch::agent
