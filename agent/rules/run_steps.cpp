#include "agent/rules/run_steps.h"

#include <vector>

namespace gaugewatch::agent {

void RunSteps::observe(const std::string& run_id, std::uint32_t rank, std::uint64_t step, std::int64_t now_ns) {
  std::lock_guard lock(mu_);
  clocks_[{run_id, rank}].observe(step, now_ns);
}

void RunSteps::forget(const std::string& run_id, std::uint32_t rank) {
  std::lock_guard lock(mu_);
  clocks_.erase({run_id, rank});
}

std::vector<RankProgress> RunSteps::progress_locked(const std::string& run_id) const {
  std::vector<RankProgress> out;
  for (auto it = clocks_.lower_bound({run_id, 0}); it != clocks_.end() && it->first.first == run_id; ++it) {
    if (it->second.known()) out.push_back(it->second.progress());
  }
  return out;
}

std::uint64_t RunSteps::begin_decision(std::uint64_t decision_id, const std::string& run_id, std::int64_t now_ns) {
  std::lock_guard lock(mu_);
  const std::uint64_t step = choose_effective_step(progress_locked(run_id), now_ns, margin_).value_or(0);
  if (step != 0) decision_steps_[decision_id] = step;
  return step;
}

std::uint64_t RunSteps::record_decision(std::uint64_t decision_id, std::uint64_t effective_step) {
  std::lock_guard lock(mu_);
  if (effective_step != 0) decision_steps_[decision_id] = effective_step;
  return effective_step;
}

std::uint64_t RunSteps::effective_step(std::uint64_t decision_id) const {
  std::lock_guard lock(mu_);
  auto it = decision_steps_.find(decision_id);
  return it == decision_steps_.end() ? 0 : it->second;
}

std::optional<std::uint64_t> RunSteps::reissue(std::uint64_t decision_id, const std::string& run_id,
                                               std::uint64_t rejected_step, std::uint64_t rank_step,
                                               std::int64_t now_ns) {
  std::lock_guard lock(mu_);
  auto it = decision_steps_.find(decision_id);
  if (it == decision_steps_.end() || it->second != rejected_step) return std::nullopt;
  it->second = reissue_effective_step(progress_locked(run_id), now_ns, margin_, rejected_step, rank_step);
  return it->second;
}

}  // namespace gaugewatch::agent
