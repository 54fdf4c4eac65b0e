#include "agent/rules/effective_step.h"

#include <algorithm>
#include <cmath>

namespace gaugewatch::agent {

namespace {
constexpr double kNanosPerSecond = 1e9;
}

void StepClock::observe(std::uint64_t step, std::int64_t now_ns) {
  if (!known_) {
    known_ = true;
    step_ = changed_step_ = step;
    seen_ns_ = changed_ns_ = now_ns;
    return;
  }
  if (step > changed_step_ && now_ns > changed_ns_) {
    const double interval_s = static_cast<double>(now_ns - changed_ns_) / kNanosPerSecond;
    const double rate = static_cast<double>(step - changed_step_) / interval_s;
    steps_per_second_ = steps_per_second_ == 0.0 ? rate : smoothing_ * rate + (1.0 - smoothing_) * steps_per_second_;
    changed_step_ = step;
    changed_ns_ = now_ns;
  } else if (step < changed_step_) {
    // A restarted process counts from 0 again: start measuring afresh.
    changed_step_ = step;
    changed_ns_ = now_ns;
    steps_per_second_ = 0.0;
  }
  step_ = step;
  seen_ns_ = now_ns;
}

RankProgress StepClock::progress() const { return RankProgress{step_, seen_ns_, steps_per_second_}; }

std::optional<std::uint64_t> choose_effective_step(const std::vector<RankProgress>& ranks, std::int64_t now_ns,
                                                   const EffectiveStepMargin& margin) {
  if (ranks.empty()) return std::nullopt;
  double latest = 0.0;
  for (const RankProgress& rank : ranks) {
    const double age_s = std::clamp(static_cast<double>(now_ns - rank.seen_ns) / kNanosPerSecond, 0.0,
                                    margin.max_report_age_seconds);
    // Steps the rank can begin until the command is in its queue; the step
    // it runs now counts as begun.
    const double ahead = rank.steps_per_second * (age_s + margin.delivery_seconds);
    latest = std::max(latest, static_cast<double>(rank.step) + std::ceil(ahead));
  }
  return static_cast<std::uint64_t>(latest) + margin.lead_steps + 1;
}

std::uint64_t reissue_effective_step(const std::vector<RankProgress>& ranks, std::int64_t now_ns,
                                     const EffectiveStepMargin& margin, std::uint64_t previous_effective_step,
                                     std::uint64_t rank_step) {
  std::uint64_t step = choose_effective_step(ranks, now_ns, margin).value_or(0);
  step = std::max(step, rank_step + margin.lead_steps + 1);
  return std::max(step, previous_effective_step + 1);
}

}  // namespace gaugewatch::agent

namespace gaugewatch::agent {

std::int64_t aligned_instant(double unix_now_s, double interval_s, double settle_s) {
  const double at = unix_now_s - settle_s;
  return static_cast<std::int64_t>(std::floor(at / interval_s) * interval_s);
}

std::vector<std::int64_t> instants_to_evaluate(std::int64_t last_done, std::int64_t latest, double interval_s,
                                               std::size_t max_catch_up) {
  if (latest <= last_done) return {};
  if (last_done == 0 || max_catch_up == 0) return {latest};
  const auto step = static_cast<std::int64_t>(interval_s);
  std::vector<std::int64_t> out;
  for (std::int64_t t = latest; t > last_done && out.size() < max_catch_up; t -= step) out.push_back(t);
  std::reverse(out.begin(), out.end());
  return out;
}

std::uint64_t fleet_effective_step(double max_step_at_fire, double max_rate_at_fire, double horizon_s,
                                   std::uint64_t lead_steps) {
  const double step = std::max(0.0, max_step_at_fire);
  const double ahead = std::max(0.0, max_rate_at_fire) * std::max(0.0, horizon_s);
  return static_cast<std::uint64_t>(std::ceil(step + ahead)) + lead_steps + 1;
}

}  // namespace gaugewatch::agent
