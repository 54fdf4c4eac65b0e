#pragma once
// Coverage (docs/hooks.md "Coverage"): every attention call the hooks see
// that trains (a gradient is needed), monitored or not and why, in totals by
// (monitored, reason) and per layer, with the correcting backends whose
// kernels take the layer's calls. Part of the runtime's state (runtime.h),
// guarded by its lock; torch-free.
//
// Reasons a call is not monitored: "dtype" (not bfloat16: the audit measures
// BF16 numerics), "dropout" (the audit cannot regenerate the dropout mask),
// "math_path" (SDPA's math fallback, e.g. dropout on the CPU: no fused op, so
// no layer), "mask" (the loaded gaugewatch ops take no attn_mask), "layout"
// (nested / packed / not (B, H, N, d)).

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hooks/agent_messages.h"

namespace gaugewatch::hooks {

class Coverage {
 public:
  // One training call; `layer` -1: a call outside the layers (math path).
  void count(std::int64_t layer, const CallVerdict& verdict);

  std::uint64_t monitored_calls() const { return monitored_calls_; }
  std::uint64_t total_calls() const { return total_calls_; }
  // Bumped when a new (monitored, reason) appears or a layer's status changes.
  std::uint64_t version() const { return version_; }

  // "attention calls: 30 monitored, 12 not monitored (math_path 12)".
  std::string summary() const;
  // Totals, and the layers whose status changed after `since` (a version).
  CoverageReport report(std::uint64_t since) const;
  // A layer's status (monitored, reason, correcting); nullptr before its first call.
  const LayerStatus* layer(std::size_t index) const;

 private:
  struct Layer {
    LayerStatus status;
    bool seen = false;
    std::uint64_t changed = 0;  // version of its last change
  };
  std::map<std::pair<bool, std::string>, std::uint64_t> calls_;
  std::vector<Layer> layers_;
  std::uint64_t monitored_calls_ = 0;
  std::uint64_t total_calls_ = 0;
  std::uint64_t version_ = 0;
};

}  // namespace gaugewatch::hooks
