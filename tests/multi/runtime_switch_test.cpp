// The hooks' runtime with switches that carry an effective step
// (docs/scaling.md, "Run-consistent switching"), driven as the interceptor
// drives it (no agent): a switch applies exactly at the boundary that begins
// its step, is rejected when that step has begun, and a re-issue of the same
// decision replaces the waiting one.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hooks/runtime.h"

namespace gaugewatch::hooks {
namespace {

HookConfig no_agent() {
  HookConfig c;
  c.socket = "none";
  c.every_n_steps = 0;  // no audits: only the commands matter here
  return c;
}

// One training pass over 2 layers; returns the step and layer 1's backend of
// the pass (its first forward begins it, at a step boundary).
std::pair<std::uint64_t, Backend> train_pass(Runtime& rt) {
  const ForwardPlan first = rt.on_forward(false, false);
  const ForwardPlan second = rt.on_forward(false, false);
  for (const ForwardPlan* f : {&second, &first}) {
    const BackwardPlan b = rt.on_backward(*f);
    rt.record_backward(b.layer, b.step, b.backend);
  }
  return {first.step, second.backend};
}

Command switch_layer_1(std::uint64_t id, std::uint64_t decision, std::uint64_t effective_step) {
  Command c;
  c.id = id;
  c.decision_id = decision;
  c.action = SwitchBackend{{1}, Backend::kPivot, effective_step};
  return c;
}

bool stats_has(Runtime& rt, const std::string& text) { return rt.stats_json().find(text) != std::string::npos; }

TEST(RuntimeEffectiveStep, AppliesExactlyAtTheBoundaryOfItsStep) {
  Runtime rt(no_agent());
  train_pass(rt);                           // step 0
  rt.on_command(switch_layer_1(5, 1, 3));   // arrives during step 0
  std::vector<std::pair<std::uint64_t, Backend>> passes;
  for (int i = 0; i < 4; ++i) passes.push_back(train_pass(rt));
  ASSERT_EQ(passes.size(), 4u);
  EXPECT_EQ(passes[0], std::make_pair(std::uint64_t{1}, Backend::kStock));
  EXPECT_EQ(passes[1], std::make_pair(std::uint64_t{2}, Backend::kStock));
  EXPECT_EQ(passes[2], std::make_pair(std::uint64_t{3}, Backend::kPivot));
  EXPECT_EQ(passes[3], std::make_pair(std::uint64_t{4}, Backend::kPivot));
  EXPECT_TRUE(stats_has(rt, "\"commands_applied\":1")) << rt.stats_json();
  EXPECT_TRUE(stats_has(rt, "[3,\"pivot\"]")) << rt.stats_json();
}

TEST(RuntimeEffectiveStep, TheNextStepIsNotLate) {
  Runtime rt(no_agent());
  train_pass(rt);
  train_pass(rt);                           // step 1
  rt.on_command(switch_layer_1(5, 1, 2));   // for the step the next boundary begins
  EXPECT_EQ(train_pass(rt), std::make_pair(std::uint64_t{2}, Backend::kPivot));
  EXPECT_TRUE(stats_has(rt, "\"commands_rejected\":0")) << rt.stats_json();
}

TEST(RuntimeEffectiveStep, AStepThatBeganIsLateAndNothingChanges) {
  Runtime rt(no_agent());
  for (int i = 0; i < 5; ++i) train_pass(rt);  // steps 0..4, step 4 running
  rt.on_command(switch_layer_1(5, 1, 4));
  rt.on_command(switch_layer_1(6, 2, 2));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(train_pass(rt).second, Backend::kStock);
  EXPECT_TRUE(stats_has(rt, "\"commands_rejected\":2")) << rt.stats_json();
  EXPECT_TRUE(stats_has(rt, "\"commands_applied\":0")) << rt.stats_json();
}

TEST(RuntimeEffectiveStep, AReissueReplacesTheWaitingSwitch) {
  Runtime rt(no_agent());
  train_pass(rt);                           // step 0
  rt.on_command(switch_layer_1(5, 9, 2));
  train_pass(rt);                           // step 1: command 5 waits for step 2
  rt.on_command(switch_layer_1(8, 9, 4));   // the agent re-issued decision 9 for step 4
  EXPECT_EQ(train_pass(rt), std::make_pair(std::uint64_t{2}, Backend::kStock));
  EXPECT_EQ(train_pass(rt), std::make_pair(std::uint64_t{3}, Backend::kStock));
  EXPECT_EQ(train_pass(rt), std::make_pair(std::uint64_t{4}, Backend::kPivot));
  EXPECT_TRUE(stats_has(rt, "\"commands_rejected\":1")) << rt.stats_json();  // 5, superseded
  EXPECT_TRUE(stats_has(rt, "\"commands_applied\":1")) << rt.stats_json();
}

TEST(RuntimeEffectiveStep, StepZeroKeepsTheNextBoundary) {
  Runtime rt(no_agent());
  train_pass(rt);
  rt.on_command(switch_layer_1(5, 1, 0));
  EXPECT_EQ(train_pass(rt), std::make_pair(std::uint64_t{1}, Backend::kPivot));
}

}  // namespace
}  // namespace gaugewatch::hooks
