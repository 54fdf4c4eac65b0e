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

void DecisionBook::add(const gaugewatch::v1::Decision& decision) {
  std::lock_guard lock(mu_);
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
  return decisions_.size();
}

}  // namespace gaugewatch::agent
