#include "hooks/pending_switches.h"

namespace gaugewatch::hooks {

SwitchTiming switch_timing(std::uint64_t effective_step, std::uint64_t step) {
  if (effective_step == 0 || effective_step == step) return SwitchTiming::kApply;
  return effective_step > step ? SwitchTiming::kWait : SwitchTiming::kLate;
}

std::string late_detail(std::uint64_t effective_step, std::uint64_t step) {
  return "late: effective step " + std::to_string(effective_step) + ", rank at step " + std::to_string(step);
}

}  // namespace gaugewatch::hooks
