#include "hooks/coverage.h"

#include <algorithm>

namespace gaugewatch::hooks {

void Coverage::count(std::int64_t layer, const CallVerdict& verdict) {
  ++total_calls_;
  if (verdict.monitored) ++monitored_calls_;
  std::pair<bool, std::string> key{verdict.monitored, verdict.monitored ? "" : verdict.reason};
  auto [it, added] = calls_.try_emplace(std::move(key), 0);
  ++it->second;
  if (added) ++version_;
  if (layer < 0) return;
  const auto index = static_cast<std::size_t>(layer);
  if (layers_.size() <= index) layers_.resize(index + 1);
  Layer& l = layers_[index];
  LayerStatus next = l.status;
  next.layer = static_cast<std::uint32_t>(index);
  if (!l.seen) {
    next.monitored = verdict.monitored;
    next.reason = verdict.monitored ? "" : verdict.reason;
    next.correcting_backends = verdict.correcting;
  } else {
    // A layer is monitored while all its calls are; the first reason that
    // stopped it stays; correcting backends: those that take every call.
    if (next.monitored && !verdict.monitored) {
      next.monitored = false;
      next.reason = verdict.reason;
    }
    std::vector<Backend> both;
    for (Backend b : next.correcting_backends) {
      if (std::find(verdict.correcting.begin(), verdict.correcting.end(), b) != verdict.correcting.end()) {
        both.push_back(b);
      }
    }
    next.correcting_backends = std::move(both);
  }
  const bool changed = !l.seen || next.monitored != l.status.monitored || next.reason != l.status.reason ||
                       next.correcting_backends != l.status.correcting_backends;
  l.seen = true;
  l.status = std::move(next);
  if (changed) l.changed = ++version_;
}

std::string Coverage::summary() const {
  std::uint64_t unmonitored = total_calls_ - monitored_calls_;
  std::string text = "attention calls: " + std::to_string(monitored_calls_) + " monitored, " +
                     std::to_string(unmonitored) + " not monitored";
  std::string reasons;
  for (const auto& [key, n] : calls_) {
    if (key.first) continue;
    reasons += (reasons.empty() ? "" : ", ") + key.second + " " + std::to_string(n);
  }
  if (!reasons.empty()) text += " (" + reasons + ")";
  std::string layers;
  for (const Layer& l : layers_) {
    if (!l.seen || l.status.monitored) continue;
    layers += (layers.empty() ? "" : ", ") + std::to_string(l.status.layer) + ": " + l.status.reason;
  }
  if (!layers.empty()) text += "; layers not monitored: " + layers;
  return text;
}

CoverageReport Coverage::report(std::uint64_t since) const {
  CoverageReport r;
  r.version = version_;
  for (const auto& [key, n] : calls_) r.calls.push_back(AttentionCallCount{key.first, key.second, n});
  for (const Layer& l : layers_) {
    if (l.seen && l.changed > since) r.layers.push_back(l.status);
  }
  return r;
}

const LayerStatus* Coverage::layer(std::size_t index) const {
  if (index >= layers_.size() || !layers_[index].seen) return nullptr;
  return &layers_[index].status;
}

}  // namespace gaugewatch::hooks
