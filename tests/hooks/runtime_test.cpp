// The runtime's pass / step boundary, layer identity, sampler and commands,
// driven as the interceptor drives it (no agent: GAUGEWATCH_SOCKET=none).

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "gaugewatch/v1/hook_service.pb.h"
#include "hooks/reporter_wire.h"
#include "hooks/runtime.h"

namespace gaugewatch::hooks {
namespace {

namespace v1 = gaugewatch::v1;

HookConfig no_agent() {
  HookConfig c;
  c.socket = "none";
  c.every_n_steps = 2;
  c.layer_fraction = 0.5;
  c.overhead_budget = 1.0;
  return c;
}

// One training pass over `layers` attention calls: forwards, then backwards in reverse.
std::vector<BackwardPlan> train_pass(Runtime& rt, int layers) {
  std::vector<ForwardPlan> forwards;
  for (int l = 0; l < layers; ++l) forwards.push_back(rt.on_forward(false, false));
  std::vector<BackwardPlan> backwards;
  for (int l = layers - 1; l >= 0; --l) {
    backwards.push_back(rt.on_backward(forwards[static_cast<std::size_t>(l)]));
    rt.record_backward(backwards.back().layer, backwards.back().step, backwards.back().backend);
  }
  return backwards;
}

TEST(Runtime, ZeroChangeLayersAndSteps) {
  Runtime rt(no_agent());
  for (int step = 0; step < 3; ++step) {
    const auto plans = train_pass(rt, 4);
    ASSERT_EQ(plans.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(plans[static_cast<std::size_t>(i)].layer, 3 - i);
      EXPECT_EQ(plans[static_cast<std::size_t>(i)].step, static_cast<std::uint64_t>(step));
    }
  }
  EXPECT_EQ(rt.layer_names(), (std::vector<std::string>{"attn.0", "attn.1", "attn.2", "attn.3"}));
}

TEST(Runtime, EvalForwardsWrapInsteadOfAddingLayers) {
  Runtime rt(no_agent());
  train_pass(rt, 2);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(rt.on_forward(false, false).layer, i % 2);  // three eval passes
  const auto plans = train_pass(rt, 2);
  EXPECT_EQ(plans[0].step, 1u);  // eval passes are not steps
  EXPECT_EQ(rt.layer_names().size(), 2u);
}

TEST(Runtime, RecomputeCallsResolveToThePendingLayer) {
  Runtime rt(no_agent());
  train_pass(rt, 3);
  // Reentrant checkpointing: forwards (counted), then per layer a recompute
  // inside the backward whose backward runs right after it.
  std::vector<ForwardPlan> forwards;
  for (int l = 0; l < 3; ++l) forwards.push_back(rt.on_forward(false, false));
  for (int l = 2; l >= 0; --l) {
    const ForwardPlan recompute = rt.on_forward(true, false);
    EXPECT_TRUE(recompute.recompute);
    EXPECT_EQ(recompute.layer, -1);
    EXPECT_EQ(rt.on_backward(recompute).layer, l);
  }
  EXPECT_EQ(rt.layer_names().size(), 3u);
}

TEST(Runtime, NamedLayersSurviveRecompute) {
  Runtime rt(no_agent());
  for (int step = 0; step < 2; ++step) {
    rt.begin_pass();
    std::vector<ForwardPlan> forwards;
    for (const char* name : {"enc.attn", "dec.attn"}) {
      rt.enter_layer(name);
      forwards.push_back(rt.on_forward(false, false));
      rt.exit_layer(name);
    }
    rt.enter_layer("dec.attn");
    const ForwardPlan recompute = rt.on_forward(true, false);
    rt.exit_layer("dec.attn");
    EXPECT_EQ(recompute.layer, 1);
    EXPECT_EQ(rt.on_backward(forwards[1]).layer, 1);
    EXPECT_EQ(rt.on_backward(forwards[0]).layer, 0);
  }
  EXPECT_EQ(rt.layer_names(), (std::vector<std::string>{"enc.attn", "dec.attn"}));
}

TEST(Runtime, SamplerRotatesThroughLayersOnEveryNthStep) {
  Runtime rt(no_agent());
  std::vector<std::vector<std::int64_t>> sampled;
  for (int step = 0; step < 8; ++step) {
    std::vector<std::int64_t> layers;
    for (const auto& plan : train_pass(rt, 4)) {
      if (plan.sample) layers.push_back(plan.layer);
    }
    std::sort(layers.begin(), layers.end());
    sampled.push_back(layers);
  }
  // every_n_steps 2, layer_fraction 0.5 of 4 layers: 2 layers on even steps, rotating.
  EXPECT_EQ(sampled[0], (std::vector<std::int64_t>{0, 1}));
  EXPECT_TRUE(sampled[1].empty());
  EXPECT_EQ(sampled[2], (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(sampled[4], (std::vector<std::int64_t>{0, 1}));
}

TEST(Runtime, SampledCallsCarryTheStepsSampledLayerCount) {
  // The auditor's queue is sized from it: a step's sampled layers all fit.
  HookConfig c = no_agent();
  c.every_n_steps = 1;
  c.layer_fraction = 0.75;
  Runtime rt(c);
  for (int step = 0; step < 3; ++step) {
    int sampled = 0;
    for (const auto& plan : train_pass(rt, 8)) {
      if (!plan.sample) {
        EXPECT_EQ(plan.sampled_layers, 0u);
        continue;
      }
      ++sampled;
      EXPECT_EQ(plan.sampled_layers, 6u);  // ceil(0.75 * 8)
    }
    EXPECT_EQ(sampled, 6) << "step " << step;
  }
}

TEST(Runtime, SwitchAppliesAtTheNextPassBoundary) {
  Runtime rt(no_agent());
  train_pass(rt, 3);
  v1::Command command;
  command.set_command_id(7);
  command.mutable_switch_backend()->add_layers(1);
  command.mutable_switch_backend()->set_backend(v1::BACKEND_GPROJ);
  rt.on_command(from_wire(command));
  // Still step 0's backward in flight: nothing changes before the boundary.
  const ForwardPlan next = rt.on_forward(false, false);  // boundary: step 1 starts, command applied
  EXPECT_EQ(next.step, 1u);
  EXPECT_EQ(next.backend, Backend::kStock);  // layer 0
  EXPECT_EQ(rt.on_forward(false, false).backend, Backend::kGproj);
  EXPECT_NE(rt.stats_json().find("\"commands_applied\":1"), std::string::npos) << rt.stats_json();
}

TEST(Runtime, MalformedCommandsAreRejectedNotApplied) {
  Runtime rt(no_agent());
  train_pass(rt, 2);
  v1::Command out_of_range;
  out_of_range.set_command_id(1);
  out_of_range.mutable_switch_backend()->add_layers(9);
  out_of_range.mutable_switch_backend()->set_backend(v1::BACKEND_PIVOT);
  v1::Command bad_backend;
  bad_backend.set_command_id(2);
  bad_backend.mutable_switch_backend()->set_backend(static_cast<v1::Backend>(42));
  v1::Command empty;
  empty.set_command_id(3);
  v1::Command capture;  // no GAUGEWATCH_CAPTURE_DIR
  capture.set_command_id(4);
  capture.mutable_capture()->set_layer(0);
  for (auto* c : {&out_of_range, &bad_backend, &empty, &capture}) rt.on_command(from_wire(*c));
  train_pass(rt, 2);
  const std::string stats = rt.stats_json();
  EXPECT_NE(stats.find("\"commands_rejected\":4"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"backward_calls\":{\"bf16\":0,\"center\":0,\"fp32\":0,\"gproj\":0,\"pivot\":0,\"stock\":4}"),
            std::string::npos)
      << stats;
}

TEST(Runtime, HelloListsLayersWithTheirBackends) {
  HookConfig c = no_agent();
  c.run_id = "r1";
  c.layer_backends = {{1, Backend::kFp32}};
  Runtime rt(c);
  train_pass(rt, 2);
  const v1::Hello hello = to_wire(rt.hello());
  EXPECT_EQ(hello.run_id(), "r1");
  ASSERT_EQ(hello.layers_size(), 2);
  EXPECT_EQ(hello.layers(0).backend(), v1::BACKEND_STOCK);
  EXPECT_EQ(hello.layers(1).backend(), v1::BACKEND_FP32);
  EXPECT_EQ(hello.layers(1).name(), "attn.1");
}

TEST(Runtime, HelloCarriesTheVersionsAsSet) {
  Runtime rt(no_agent());
  rt.set_versions("2.11.0+cu130", format_cuda_version(13000), format_cuda_version(12080));
  train_pass(rt, 1);
  const v1::Hello hello = to_wire(rt.hello());
  EXPECT_EQ(hello.torch_version(), "2.11.0+cu130");
  EXPECT_EQ(hello.cuda_version(), "13.0");
  EXPECT_EQ(hello.driver_version(), "12.8");
}

TEST(Runtime, CudaVersionNumbersFormatAsMajorMinor) {
  EXPECT_EQ(format_cuda_version(13000), "13.0");
  EXPECT_EQ(format_cuda_version(12040), "12.4");
  EXPECT_EQ(format_cuda_version(12090), "12.9");
  EXPECT_EQ(format_cuda_version(11080), "11.8");
  EXPECT_EQ(format_cuda_version(0), "");   // cudaDriverGetVersion without a driver
  EXPECT_EQ(format_cuda_version(-1), "");
}

TEST(Runtime, SkippedAuditsAreCountedByReason) {
  Runtime rt(no_agent());
  train_pass(rt, 2);
  rt.count_audit_skipped("unsupported operand layout");
  rt.count_audit_skipped("unsupported operand layout");
  rt.count_audit_skipped("auditor busy (queue full)");
  const std::string stats = rt.stats_json();
  EXPECT_NE(stats.find("\"audits_skipped_other\":3"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"audits_skipped_reasons\":{\"auditor busy (queue full)\":1,"
                       "\"unsupported operand layout\":2}"),
            std::string::npos)
      << stats;
}

TEST(Runtime, StatsKeepTheLatestSampleOfEachLayer) {
  Runtime rt(no_agent());
  train_pass(rt, 2);
  SampleData data;
  data.step = 0;
  data.layer = 1;
  data.metrics.fill(std::nan(""));
  data.metrics[static_cast<std::size_t>(reference::MetricId::kLiveGaugeViolation)] = 0.25;
  data.metrics[static_cast<std::size_t>(reference::MetricId::kKeyRms)] = -1.0;  // not reportable: left out
  data.audit_us = 10.0;
  rt.submit_sample(data);
  const std::string stats = rt.stats_json();
  EXPECT_NE(stats.find("\"latest\":{\"live_gauge_violation\":0.25,\"step\":0}"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"latest\":{}"), std::string::npos) << stats;  // layer 0: no sample yet
  EXPECT_NE(stats.find("\"samples_submitted\":1"), std::string::npos) << stats;
}

}  // namespace
}  // namespace gaugewatch::hooks

namespace gaugewatch::hooks {
namespace {

// Passes of `layers` calls; `micro` backward passes, then (optionally) an
// optimizer step signal: one training iteration with gradient accumulation.
std::vector<BackwardPlan> accumulate(Runtime& rt, int layers, int micro, bool signal) {
  std::vector<BackwardPlan> all;
  for (int m = 0; m < micro; ++m) {
    for (const auto& p : train_pass(rt, layers)) all.push_back(p);
  }
  if (signal) rt.optimizer_step();
  return all;
}

TEST(RuntimeSteps, SwitchOfACudaLayerToAProjectionBackendIsApplied) {
  // No refusal up front any more: the interceptor probes the op at first use
  // and falls back to stock if it refuses.
  Runtime rt(no_agent());
  for (int l = 0; l < 2; ++l) rt.on_forward(false, /*cuda=*/true);
  train_pass(rt, 2);
  for (const auto backend : {v1::BACKEND_GPROJ, v1::BACKEND_PIVOT}) {
    v1::Command command;
    command.set_command_id(backend == v1::BACKEND_GPROJ ? 1 : 2);
    command.mutable_switch_backend()->add_layers(backend == v1::BACKEND_GPROJ ? 0 : 1);
    command.mutable_switch_backend()->set_backend(backend);
    rt.on_command(from_wire(command));
  }
  const ForwardPlan l0 = rt.on_forward(false, true);
  EXPECT_EQ(l0.backend, Backend::kGproj);
  EXPECT_EQ(rt.on_forward(false, true).backend, Backend::kPivot);
  EXPECT_NE(rt.stats_json().find("\"commands_applied\":2"), std::string::npos) << rt.stats_json();
}

TEST(RuntimeSteps, GradAccumConfigMakesMicroBatchesOneStep) {
  HookConfig c = no_agent();
  c.grad_accum = 3;
  c.every_n_steps = 2;
  c.layer_fraction = 1.0;
  Runtime rt(c);
  for (int step = 0; step < 5; ++step) {
    const auto plans = accumulate(rt, 2, 3, false);
    int sampled = 0;
    for (std::size_t i = 0; i < plans.size(); ++i) {
      EXPECT_EQ(plans[i].step, static_cast<std::uint64_t>(step)) << "call " << i;
      if (plans[i].sample) {
        ++sampled;
        EXPECT_LT(i, 2u) << "only the first micro-batch's backward of each layer is audited";
      }
    }
    EXPECT_EQ(sampled, step % 2 == 0 ? 2 : 0) << "step " << step;
  }
  const std::string stats = rt.stats_json();
  EXPECT_NE(stats.find("\"step_mode\":\"backward\""), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"backward_passes\":15"), std::string::npos) << stats;
}

TEST(RuntimeSteps, OptimizerStepsCountStepsWhenSignalled) {
  HookConfig c = no_agent();
  c.every_n_steps = 3;
  c.layer_fraction = 1.0;
  Runtime rt(c);
  rt.use_optimizer_steps();
  std::vector<std::uint64_t> sampled_steps;
  for (int step = 0; step < 7; ++step) {
    // 4 micro-batches, an eval forward in the middle (not a step), then optimizer.step().
    const auto first = accumulate(rt, 3, 2, false);
    rt.on_forward(false, false);  // eval pass: wraps
    rt.on_forward(false, false);
    rt.on_forward(false, false);
    const auto second = accumulate(rt, 3, 2, true);
    int sampled = 0;
    for (const auto* plans : {&first, &second}) {
      for (const auto& p : *plans) {
        EXPECT_EQ(p.step, static_cast<std::uint64_t>(step));
        if (p.sample) ++sampled;
      }
    }
    if (sampled > 0) sampled_steps.push_back(static_cast<std::uint64_t>(step));
    EXPECT_EQ(sampled, step % 3 == 0 ? 3 : 0) << "step " << step;  // each layer once per sampled step
  }
  EXPECT_EQ(sampled_steps, (std::vector<std::uint64_t>{0, 3, 6}));
  const std::string stats = rt.stats_json();
  EXPECT_NE(stats.find("\"step_mode\":\"optimizer\""), std::string::npos) << stats;
  EXPECT_NE(stats.find("\"optimizer_steps\":7"), std::string::npos) << stats;
  EXPECT_EQ(rt.on_forward(false, false).step, 7u);  // the boundary after the 7th optimizer step
}

// The CUDA shape of test_gpu_optimizer_steps_under_gradient_accumulation:
// the backwards on one thread (autograd's device thread), the helper's
// optimizer-step hook and stats reads on another (Python's main thread),
// samples submitted by a third (the auditor) and commands / stats by a
// fourth (the reporter), all at once: every step completes (no wait between
// them), and each layer is sampled once per sampled step.
TEST(RuntimeSteps, StepHooksDuringAccumulationFromOtherThreadsNeverBlock) {
  HookConfig c = no_agent();
  c.every_n_steps = 2;
  c.layer_fraction = 1.0;
  Runtime rt(c);
  rt.use_optimizer_steps();
  std::atomic<bool> done{false};
  std::atomic<int> samples{0};
  std::thread auditor([&] {
    while (!done.load()) {
      SampleData sample;
      sample.layer = samples.load() % 3;
      rt.submit_sample(sample);  // (no audit time: the budget would skip sampled steps)
      ++samples;
      std::this_thread::yield();
    }
  });
  std::thread reporter([&] {
    for (std::uint64_t id = 1; !done.load(); ++id) {
      v1::Command command;
      command.set_command_id(id);
      command.mutable_set_sampling()->set_max_rows(16);
      rt.on_command(from_wire(command));
      (void)to_wire(rt.hello());
      (void)rt.stats_json();
      std::this_thread::yield();
    }
  });
  std::vector<int> sampled_per_step;
  const auto t0 = std::chrono::steady_clock::now();
  for (int step = 0; step < 50; ++step) {
    int sampled = 0;
    std::thread device([&] {  // micro-batch 1's backward, then micro-batch 2's
      for (const auto& p : accumulate(rt, 3, 2, false)) sampled += p.sample ? 1 : 0;
    });
    device.join();
    std::thread main_thread([&] {  // optimizer.step() -> the helper's post-hook
      rt.optimizer_step();
      (void)rt.stats_json();
    });
    main_thread.join();
    sampled_per_step.push_back(sampled);
  }
  done = true;
  auditor.join();
  reporter.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  for (int step = 0; step < 50; ++step) {
    EXPECT_EQ(sampled_per_step[static_cast<std::size_t>(step)], step % 2 == 0 ? 3 : 0) << "step " << step;
  }
  EXPECT_EQ(rt.on_forward(false, false).step, 50u);
  EXPECT_GT(samples.load(), 0);
}

TEST(RuntimeSteps, FirstOptimizerSignalSwitchesModeAndCommandsWaitForTheStep) {
  HookConfig c = no_agent();
  c.every_n_steps = 0;
  Runtime rt(c);
  accumulate(rt, 2, 2, true);  // no use_optimizer_steps(): the two passes were steps 0 and 1
  const auto first = train_pass(rt, 2);
  EXPECT_EQ(first.back().step, 2u);  // the signal's boundary
  // A switch arriving mid-step (between micro-batches) waits for the step boundary.
  v1::Command command;
  command.set_command_id(5);
  command.mutable_switch_backend()->add_layers(0);
  command.mutable_switch_backend()->set_backend(v1::BACKEND_FP32);
  rt.on_command(from_wire(command));
  const auto second = train_pass(rt, 2);  // a micro-batch boundary in step 2: not applied
  ASSERT_EQ(second.back().layer, 0);
  EXPECT_EQ(second.back().step, 2u);
  EXPECT_EQ(second.back().backend, Backend::kStock);
  rt.optimizer_step();
  const auto third = train_pass(rt, 2);
  ASSERT_EQ(third.back().layer, 0);
  EXPECT_EQ(third.back().step, 3u);
  EXPECT_EQ(third.back().backend, Backend::kFp32);
}

TEST(RuntimeFork, ChildTurnsMonitoringOffParentCarriesOn) {
  HookConfig c = no_agent();
  c.every_n_steps = 1;
  c.layer_fraction = 1.0;
  Runtime rt(c);
  train_pass(rt, 2);
  rt.prepare_fork();
  rt.after_fork_parent();
  int sampled = 0;
  for (const auto& p : train_pass(rt, 2)) sampled += p.sample ? 1 : 0;
  EXPECT_EQ(sampled, 2) << "the parent samples as before";
  rt.prepare_fork();
  rt.after_fork_child();  // as in the child (same object here)
  EXPECT_TRUE(rt.forked_child());
  for (const auto& p : train_pass(rt, 2)) EXPECT_FALSE(p.sample || p.capture);
  EXPECT_NE(rt.stats_json().find("\"forked_child\":true"), std::string::npos);
  rt.shutdown();  // no threads to stop: returns at once
}

TEST(RuntimeFork, RealForkChildExitsCleanlyWithTheReporterThreadLeftBehind) {
  // The process-wide runtime, with its reporter thread retrying an absent
  // agent (so its locks are in use around the fork); the child runs passes,
  // logs, and exits through atexit (which in the parent flushes and joins).
  ::setenv("GAUGEWATCH_SOCKET", "/nonexistent/gaugewatch-test.sock", 1);
  ::setenv("GAUGEWATCH_RECONNECT_MAX_MS", "10", 1);
  ::setenv("GAUGEWATCH_SAMPLE_EVERY", "1", 1);
  Runtime& rt = runtime();
  train_pass(rt, 2);
  train_pass(rt, 2);
  for (int round = 0; round < 20; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      bool ok = rt.forked_child();
      for (const auto& p : train_pass(rt, 2)) ok = ok && !p.sample;
      ok = ok && rt.stats_json().find("\"reporter\":null") != std::string::npos;
      std::exit(ok ? 0 : 3);  // atexit: shutdown() must not touch the parent's threads
    }
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    pid_t done = 0;
    while ((done = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (done == 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      FAIL() << "forked child " << round << " hung";
    }
    ASSERT_TRUE(WIFEXITED(status)) << "child " << round << " crashed: " << status;
    ASSERT_EQ(WEXITSTATUS(status), 0) << "child " << round;
  }
  EXPECT_FALSE(rt.forked_child());
  int sampled = 0;
  for (const auto& p : train_pass(rt, 2)) sampled += p.sample ? 1 : 0;
  EXPECT_EQ(sampled, 1) << rt.stats_json();  // default layer fraction 0.25 of 2 layers: 1
}

}  // namespace
}  // namespace gaugewatch::hooks
