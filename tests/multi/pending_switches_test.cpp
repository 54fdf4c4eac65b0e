#include "hooks/pending_switches.h"

#include <gtest/gtest.h>

#include <string>

namespace gaugewatch::hooks {
namespace {

using Queue = PendingSwitches<std::string>;

Queue::Entry entry(std::uint64_t id, std::uint64_t decision, std::uint64_t effective, std::string what) {
  return Queue::Entry{id, decision, effective, std::move(what)};
}

TEST(SwitchTiming, ClassifiesAgainstTheStepThatBegins) {
  EXPECT_EQ(switch_timing(0, 17), SwitchTiming::kApply);   // no effective step: next boundary
  EXPECT_EQ(switch_timing(17, 17), SwitchTiming::kApply);
  EXPECT_EQ(switch_timing(18, 17), SwitchTiming::kWait);
  EXPECT_EQ(switch_timing(16, 17), SwitchTiming::kLate);
  EXPECT_EQ(late_detail(16, 17), "late: effective step 16, rank at step 17");
}

TEST(PendingSwitches, AppliesExactlyAtTheEffectiveStep) {
  Queue queue;
  queue.add(entry(1, 1, 5, "gproj"));
  for (std::uint64_t step = 1; step < 5; ++step) {
    const auto due = queue.take_due(step);
    EXPECT_TRUE(due.apply.empty()) << "step " << step;
    EXPECT_TRUE(due.late.empty()) << "step " << step;
  }
  const auto due = queue.take_due(5);
  ASSERT_EQ(due.apply.size(), 1u);
  EXPECT_EQ(due.apply[0].command, "gproj");
  EXPECT_TRUE(queue.empty());
}

TEST(PendingSwitches, StepZeroAppliesAtTheNextBoundaryInCommandOrder) {
  Queue queue;
  queue.add(entry(9, 0, 0, "second"));
  queue.add(entry(4, 0, 0, "first"));
  queue.add(entry(10, 0, 8, "later"));
  const auto due = queue.take_due(3);
  ASSERT_EQ(due.apply.size(), 2u);
  EXPECT_EQ(due.apply[0].command, "first");
  EXPECT_EQ(due.apply[1].command, "second");
  EXPECT_EQ(queue.size(), 1u);
}

TEST(PendingSwitches, AStepThatWentByIsLateNotApplied) {
  Queue queue;
  queue.add(entry(3, 2, 5, "gproj"));
  const auto due = queue.take_due(6);  // boundary 5 was never seen with it queued
  EXPECT_TRUE(due.apply.empty());
  ASSERT_EQ(due.late.size(), 1u);
  EXPECT_EQ(due.late[0].command_id, 3u);
  EXPECT_TRUE(queue.empty());
}

TEST(PendingSwitches, AReissueOfTheSameDecisionReplacesTheWaitingCommand) {
  Queue queue;
  EXPECT_TRUE(queue.add(entry(3, 2, 5, "gproj@5")).empty());
  EXPECT_TRUE(queue.add(entry(4, 7, 5, "other decision")).empty());
  const auto replaced = queue.add(entry(8, 2, 9, "gproj@9"));
  ASSERT_EQ(replaced.size(), 1u);
  EXPECT_EQ(replaced[0], 3u);
  auto due = queue.take_due(5);
  ASSERT_EQ(due.apply.size(), 1u);
  EXPECT_EQ(due.apply[0].command, "other decision");
  due = queue.take_due(9);
  ASSERT_EQ(due.apply.size(), 1u);
  EXPECT_EQ(due.apply[0].command, "gproj@9");
}

TEST(PendingSwitches, CommandsOfNoDecisionReplaceNothing) {
  Queue queue;
  queue.add(entry(1, 0, 5, "a"));
  EXPECT_TRUE(queue.add(entry(2, 0, 5, "b")).empty());
  EXPECT_EQ(queue.take_due(5).apply.size(), 2u);
}

}  // namespace
}  // namespace gaugewatch::hooks
