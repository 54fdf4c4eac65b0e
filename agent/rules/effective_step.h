#pragma once
// The common step at which a switch decision for (run, layer) takes effect on
// every rank of the run (docs/scaling.md, "Run-consistent switching").
//
// Each rank's hooks report the step they are running (SampleBatch.current_step,
// at least once a second); StepClock turns those reports into a step rate per
// rank, and choose_effective_step picks a step that every rank, projected
// forward by its rate over the command's delivery time, has not begun yet.
// The pick errs late: a rank that began the step before the command arrived
// rejects it (docs/scaling.md), and the agent re-issues the decision
// to every rank with reissue_effective_step.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace gaugewatch::agent {

// One rank's progress as the agent last heard it.
struct RankProgress {
  std::uint64_t step = 0;          // step the rank was running
  std::int64_t seen_ns = 0;        // agent clock when that was reported
  double steps_per_second = 0.0;   // 0: unknown yet
};

// Per-rank step-rate estimate from successive step reports. The rate is
// measured between reports in which the step changed (a report that repeats a
// step says nothing about the rate), smoothed with weight `smoothing` on the
// newest interval. Reports of an unchanged step leave the rate as it is, so
// a rank that stalls keeps the rate it had (the margin errs large).
class StepClock {
 public:
  explicit StepClock(double smoothing = 0.5) : smoothing_(smoothing) {}

  void observe(std::uint64_t step, std::int64_t now_ns);
  RankProgress progress() const;
  bool known() const { return known_; }

 private:
  double smoothing_;
  bool known_ = false;
  std::uint64_t step_ = 0;
  std::int64_t seen_ns_ = 0;
  std::uint64_t changed_step_ = 0;     // step at the last change
  std::int64_t changed_ns_ = 0;        // when the step last changed
  double steps_per_second_ = 0.0;
};

struct EffectiveStepMargin {
  // Time from the decision until the command is in every rank's queue: the
  // agent-to-trainer stream, plus the admin-API forward to peer agents of the
  // run (docs/scaling.md). Defaults hold for a loaded node and a LAN hop.
  double delivery_seconds = 2.0;
  // Steps added after the latest projected step, for a rank whose rate
  // estimate is low (a step that just got slower).
  std::uint64_t lead_steps = 2;
  // Projection stops at this report age: a rank silent for longer (a hung or
  // finished rank) does not push the step arbitrarily far.
  double max_report_age_seconds = 30.0;
};

// The first step no rank of `ranks` can have begun by now + delivery time;
// nullopt when no rank has reported a step (the caller sends effective_step 0:
// each process switches at its next step boundary, as for a single process).
std::optional<std::uint64_t> choose_effective_step(const std::vector<RankProgress>& ranks, std::int64_t now_ns,
                                                   const EffectiveStepMargin& margin);

// The step for re-issuing a decision that a rank rejected as late (it was
// already running `rank_step` > the previous effective step): the choice
// from the ranks' progress now, and never earlier than rank_step + lead steps
// + 1 nor than the previous effective step + 1.
std::uint64_t reissue_effective_step(const std::vector<RankProgress>& ranks, std::int64_t now_ns,
                                     const EffectiveStepMargin& margin, std::uint64_t previous_effective_step,
                                     std::uint64_t rank_step);

}  // namespace gaugewatch::agent

namespace gaugewatch::agent {

// Fleet decisions (docs/scaling.md, "Across nodes"): every agent evaluates
// PromQL fleet rules at the same instants and computes the same step from
// the same stored numbers.

// The evaluation instant (unix seconds) for a poll at unix_now_s: the latest
// multiple of interval_s at or before unix_now_s - settle_s, so that every
// agent polling within the same interval asks about the same instant.
std::int64_t aligned_instant(double unix_now_s, double interval_s, double settle_s);

// The instants to evaluate now, oldest first: those after `last_done` up to
// `latest` (both aligned), at most `max_catch_up` of the newest when an agent
// missed many (it was down or could not reach Prometheus); just `latest`
// when nothing was evaluated yet (last_done 0).
std::vector<std::int64_t> instants_to_evaluate(std::int64_t last_done, std::int64_t latest, double interval_s,
                                               std::size_t max_catch_up);

// The effective step of a fleet decision that fired at instant T, from the
// run's largest rank step at T and its largest step rate at T (steps/s):
// every rank is projected over horizon_s (settle + interval + delivery, the
// longest time from T until any agent's ranks have the command).
std::uint64_t fleet_effective_step(double max_step_at_fire, double max_rate_at_fire, double horizon_s,
                                   std::uint64_t lead_steps);

}  // namespace gaugewatch::agent
