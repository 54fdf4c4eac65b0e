#pragma once
// Switch commands that wait for their effective step (SwitchBackend.effective_step:
// the step from which every rank of the run runs the new backward;
// docs/scaling.md, "Run-consistent switching").
//
// The runtime classifies a command when it arrives and again at each step
// boundary, where `step` is the step that begins there:
//   effective 0 or == step      -> apply now (the new backward runs from `step`)
//   effective > step            -> wait
//   effective < step            -> late: the rank already ran step `effective`
//                                  with the old backward; applying now would
//                                  make it differ from the ranks that switched
//                                  on time, so the command is rejected with
//                                  late_detail() and the agent re-issues the
//                                  decision to every rank with a later step.
// On arrival, `step` is the step running now plus one (the next boundary),
// so a command for the running step is late at once rather than a step later.
// A re-issued command of the same decision replaces the one still waiting.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gaugewatch::hooks {

enum class SwitchTiming { kApply, kWait, kLate };

SwitchTiming switch_timing(std::uint64_t effective_step, std::uint64_t step);

// The rejection detail of a late command: "late: effective step E, rank at
// step S" (the agent parses nothing from it; CommandAck.rank_step carries S).
std::string late_detail(std::uint64_t effective_step, std::uint64_t step);

template <class Command>
class PendingSwitches {
 public:
  struct Entry {
    std::uint64_t command_id = 0;
    std::uint64_t decision_id = 0;    // 0: a command of no decision, replaces nothing
    std::uint64_t effective_step = 0;
    Command command;
  };

  // Queues a waiting command; returns the command ids it replaces (waiting
  // commands of the same nonzero decision_id).
  std::vector<std::uint64_t> add(Entry entry) {
    std::vector<std::uint64_t> replaced;
    if (entry.decision_id != 0) {
      auto same = [&](const Entry& e) { return e.decision_id == entry.decision_id; };
      for (const Entry& e : entries_) {
        if (same(e)) replaced.push_back(e.command_id);
      }
      entries_.erase(std::remove_if(entries_.begin(), entries_.end(), same), entries_.end());
    }
    entries_.push_back(std::move(entry));
    return replaced;
  }

  struct Due {
    std::vector<Entry> apply;  // effective at `step`, by command id
    std::vector<Entry> late;   // effective before `step`
  };

  // Removes and returns the commands due at the boundary that begins `step`.
  Due take_due(std::uint64_t step) {
    Due due;
    std::vector<Entry> keep;
    for (Entry& e : entries_) {
      switch (switch_timing(e.effective_step, step)) {
        case SwitchTiming::kApply: due.apply.push_back(std::move(e)); break;
        case SwitchTiming::kLate: due.late.push_back(std::move(e)); break;
        case SwitchTiming::kWait: keep.push_back(std::move(e)); break;
      }
    }
    entries_ = std::move(keep);
    auto by_id = [](const Entry& a, const Entry& b) { return a.command_id < b.command_id; };
    std::sort(due.apply.begin(), due.apply.end(), by_id);
    return due;
  }

  std::size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  void clear() { entries_.clear(); }

 private:
  std::vector<Entry> entries_;
};

}  // namespace gaugewatch::hooks
