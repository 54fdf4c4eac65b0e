#pragma once
// The agent's view of where each run's ranks are (a StepClock per rank) and
// the effective step of each run-wide switch decision (docs/scaling.md,
// "Run-consistent switching"). Thread-safe: sample batches of many streams
// update it while decisions and acks read it.

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "agent/rules/effective_step.h"

namespace gaugewatch::agent {

class RunSteps {
 public:
  explicit RunSteps(EffectiveStepMargin margin = {}) : margin_(margin) {}

  // A rank reported the step it runs (SampleBatch.current_step), at now_ns
  // on the agent's steady clock.
  void observe(const std::string& run_id, std::uint32_t rank, std::uint64_t step, std::int64_t now_ns);
  // The rank left for good (finished or forgotten): its step no longer holds
  // the run's choice back.
  void forget(const std::string& run_id, std::uint32_t rank);

  // Picks and records the effective step of a new run-wide decision; 0 when
  // no rank of the run has reported a step (each process switches at its next
  // step boundary).
  std::uint64_t begin_decision(std::uint64_t decision_id, const std::string& run_id, std::int64_t now_ns);
  // Records a decision's effective step chosen elsewhere (a fleet decision);
  // returns it.
  std::uint64_t record_decision(std::uint64_t decision_id, std::uint64_t effective_step);
  // The recorded effective step of a decision (0: none, or not run-wide).
  std::uint64_t effective_step(std::uint64_t decision_id) const;

  // A rank rejected the decision's switch for effective step `rejected_step`
  // as late (it runs rank_step). Returns the new effective step to send to
  // every rank of the run, or nullopt when the decision was already re-issued
  // past `rejected_step` (another rank's rejection of the same step came
  // first) or is not a run-wide decision with a step.
  std::optional<std::uint64_t> reissue(std::uint64_t decision_id, const std::string& run_id,
                                       std::uint64_t rejected_step, std::uint64_t rank_step, std::int64_t now_ns);

  const EffectiveStepMargin& margin() const { return margin_; }

 private:
  std::vector<RankProgress> progress_locked(const std::string& run_id) const;

  const EffectiveStepMargin margin_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::uint32_t>, StepClock> clocks_;
  std::map<std::uint64_t, std::uint64_t> decision_steps_;  // decision id -> effective step
};

}  // namespace gaugewatch::agent
