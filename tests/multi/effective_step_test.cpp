#include "agent/rules/effective_step.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace gaugewatch::agent {
namespace {

constexpr std::int64_t kSecond = 1'000'000'000;

TEST(StepClock, MeasuresTheRateBetweenStepChanges) {
  StepClock clock;
  clock.observe(10, 0);
  EXPECT_EQ(clock.progress().steps_per_second, 0.0);  // one report: no rate yet
  clock.observe(10, kSecond / 2);                     // same step: no interval
  EXPECT_EQ(clock.progress().steps_per_second, 0.0);
  clock.observe(14, kSecond);                         // 4 steps in 1 s
  EXPECT_DOUBLE_EQ(clock.progress().steps_per_second, 4.0);
  clock.observe(16, 2 * kSecond);                     // 2 steps in 1 s, smoothed 0.5
  EXPECT_DOUBLE_EQ(clock.progress().steps_per_second, 3.0);
  EXPECT_EQ(clock.progress().step, 16u);
  EXPECT_EQ(clock.progress().seen_ns, 2 * kSecond);
}

TEST(StepClock, StallKeepsTheRateAndRestartMeasuresAfresh) {
  StepClock clock;
  clock.observe(0, 0);
  clock.observe(10, kSecond);
  clock.observe(10, 5 * kSecond);  // stalled four seconds
  EXPECT_DOUBLE_EQ(clock.progress().steps_per_second, 10.0);
  EXPECT_EQ(clock.progress().seen_ns, 5 * kSecond);
  clock.observe(1, 6 * kSecond);   // a restarted process
  EXPECT_EQ(clock.progress().steps_per_second, 0.0);
  EXPECT_EQ(clock.progress().step, 1u);
  clock.observe(3, 7 * kSecond);
  EXPECT_DOUBLE_EQ(clock.progress().steps_per_second, 2.0);
}

TEST(EffectiveStep, NoRankReportedGivesNoStep) {
  EXPECT_FALSE(choose_effective_step({}, 0, EffectiveStepMargin{}).has_value());
}

TEST(EffectiveStep, LiesBeyondEveryRanksProjectedStep) {
  EffectiveStepMargin margin;
  margin.delivery_seconds = 2.0;
  margin.lead_steps = 2;
  // Rank 0: step 100 at 10 steps/s, heard 1 s ago -> can begin up to 100 + 30.
  // Rank 1: step 98 at 12 steps/s, heard now -> 98 + 24.
  const std::vector<RankProgress> ranks = {{100, 9 * kSecond, 10.0}, {98, 10 * kSecond, 12.0}};
  EXPECT_EQ(choose_effective_step(ranks, 10 * kSecond, margin), 130u + 2 + 1);
}

TEST(EffectiveStep, UnknownRateStillLeadsTheLatestStep) {
  EffectiveStepMargin margin;
  margin.lead_steps = 3;
  const std::vector<RankProgress> ranks = {{7, 0, 0.0}, {9, 0, 0.0}};
  EXPECT_EQ(choose_effective_step(ranks, 100 * kSecond, margin), 9u + 3 + 1);
}

TEST(EffectiveStep, ProjectionStopsAtTheMaximumReportAge) {
  EffectiveStepMargin margin;
  margin.delivery_seconds = 1.0;
  margin.lead_steps = 0;
  margin.max_report_age_seconds = 4.0;
  // Silent for an hour at 1 step/s: projected over 4 s + 1 s only.
  const std::vector<RankProgress> ranks = {{50, 0, 1.0}};
  EXPECT_EQ(choose_effective_step(ranks, 3600 * kSecond, margin), 50u + 5 + 1);
}

TEST(EffectiveStep, FractionalProjectionRoundsUp) {
  EffectiveStepMargin margin;
  margin.delivery_seconds = 1.0;
  margin.lead_steps = 0;
  const std::vector<RankProgress> ranks = {{20, 0, 0.25}};  // a quarter step until delivery
  EXPECT_EQ(choose_effective_step(ranks, 0, margin), 22u);
}

TEST(EffectiveStep, ReissueComesAfterTheLateRankAndThePreviousStep) {
  EffectiveStepMargin margin;
  margin.delivery_seconds = 0.0;
  margin.lead_steps = 2;
  // The reports lag behind the rank that rejected: its step decides.
  const std::vector<RankProgress> ranks = {{40, 0, 0.0}, {41, 0, 0.0}};
  EXPECT_EQ(reissue_effective_step(ranks, 0, margin, 45, 47), 47u + 2 + 1);
  // Reports ahead of the rejecting rank's step decide.
  EXPECT_EQ(reissue_effective_step({{60, 0, 0.0}}, 0, margin, 45, 47), 60u + 2 + 1);
  // Never at or before the previous effective step.
  EXPECT_EQ(reissue_effective_step({{1, 0, 0.0}}, 0, margin, 45, 1), 46u);
  EXPECT_EQ(reissue_effective_step({}, 0, margin, 45, 1), 46u);
}

}  // namespace
}  // namespace gaugewatch::agent

namespace gaugewatch::agent {
namespace {

TEST(FleetStep, AgentsPollingWithinOneIntervalAskAboutTheSameInstant) {
  // Interval 10 s, settle 15 s: polls at 995.0 .. 1004.9 ask about 980.
  EXPECT_EQ(aligned_instant(995.0, 10.0, 15.0), 980);
  EXPECT_EQ(aligned_instant(1000.0, 10.0, 15.0), 980);
  EXPECT_EQ(aligned_instant(1004.9, 10.0, 15.0), 980);
  EXPECT_EQ(aligned_instant(1005.0, 10.0, 15.0), 990);
}

TEST(FleetStep, AnAgentThatMissedInstantsEvaluatesThemInOrder) {
  EXPECT_EQ(instants_to_evaluate(0, 980, 10.0, 5), (std::vector<std::int64_t>{980}));
  EXPECT_TRUE(instants_to_evaluate(980, 980, 10.0, 5).empty());
  EXPECT_EQ(instants_to_evaluate(980, 990, 10.0, 5), (std::vector<std::int64_t>{990}));
  EXPECT_EQ(instants_to_evaluate(950, 990, 10.0, 5), (std::vector<std::int64_t>{960, 970, 980, 990}));
  EXPECT_EQ(instants_to_evaluate(900, 990, 10.0, 3), (std::vector<std::int64_t>{970, 980, 990}));
}

TEST(FleetStep, SameNumbersGiveTheSameStep) {
  // Step 1000 at T, 2.5 steps/s, horizon 15 + 10 + 2 s -> 1000 + 67.5 -> 1068, + lead 2 + 1.
  EXPECT_EQ(fleet_effective_step(1000.0, 2.5, 27.0, 2), 1071u);
  EXPECT_EQ(fleet_effective_step(1000.0, 0.0, 27.0, 2), 1003u);   // no rate yet
  EXPECT_EQ(fleet_effective_step(-1.0, -3.0, 27.0, 0), 1u);        // nonsense from a query: still after step 0
}

}  // namespace
}  // namespace gaugewatch::agent
