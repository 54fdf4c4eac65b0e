#include "agent/state/decision_book.h"

#include <algorithm>

namespace gaugewatch::agent {

bool target_covers_rank(const gaugewatch::v1::Target& target, const std::string& run_id,
                        std::uint32_t rank) {
  if (!target.all_runs() && target.run_id() != run_id) return false;
  if (target.has_rank() && target.rank() != rank) return false;
  return true;
}

bool target_covers(const gaugewatch::v1::Target& target, const std::string& run_id,
                   std::uint32_t rank, std::uint32_t layer) {
  if (!target_covers_rank(target, run_id, rank)) return false;
  return target.layers().empty() ||
         std::find(target.layers().begin(), target.layers().end(), layer) != target.layers().end();
}

bool same_scope(const gaugewatch::v1::Target& a, const gaugewatch::v1::Target& b) {
  return a.run_id() == b.run_id() && a.all_runs() == b.all_runs() &&
         a.has_rank() == b.has_rank() && (!a.has_rank() || a.rank() == b.rank()) &&
         std::equal(a.layers().begin(), a.layers().end(), b.layers().begin(), b.layers().end());
}

void DecisionBook::add(const gaugewatch::v1::Decision& decision) {
  std::lock_guard lock(mu_);
  ++added_;
  std::erase_if(decisions_, [&](const gaugewatch::v1::Decision& held) {
    return same_scope(held.target(), decision.target());
  });
  decisions_.push_back(decision);
}

DecisionBook::Desired DecisionBook::desired(const std::string& run_id, std::uint32_t rank,
                                            std::uint32_t layer) const {
  std::lock_guard lock(mu_);
  for (auto it = decisions_.rbegin(); it != decisions_.rend(); ++it) {
    if (target_covers(it->target(), run_id, rank, layer)) return {it->backend(), it->decision_id()};
  }
  return {};
}

std::size_t DecisionBook::size() const {
  std::lock_guard lock(mu_);
  return added_;
}

std::size_t DecisionBook::in_force() const {
  std::lock_guard lock(mu_);
  return decisions_.size();
}

}  // namespace gaugewatch::agent
