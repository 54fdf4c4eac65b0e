#pragma once
// The switch decisions in force, in memory: the newest decision whose target
// covers (run, rank, layer) names that layer's desired backend. Only the
// newest decision of each target scope is held: an older one of the same scope
// can never be the newest that covers a layer, so memory stays bounded by the
// number of scopes (the store keeps the history).

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "gaugewatch/v1/admin_service.pb.h"

namespace gaugewatch::agent {

bool target_covers(const gaugewatch::v1::Target& target, const std::string& run_id,
                   std::uint32_t rank, std::uint32_t layer);
// Same run_id, all_runs, rank (or none) and layer list.
bool same_scope(const gaugewatch::v1::Target& a, const gaugewatch::v1::Target& b);
bool target_covers_rank(const gaugewatch::v1::Target& target, const std::string& run_id,
                        std::uint32_t rank);

class DecisionBook {
 public:
  struct Desired {
    gaugewatch::v1::Backend backend = gaugewatch::v1::BACKEND_UNSPECIFIED;
    std::uint64_t decision_id = 0;
  };

  void add(const gaugewatch::v1::Decision& decision);
  Desired desired(const std::string& run_id, std::uint32_t rank, std::uint32_t layer) const;
  // Decisions added (recorded or loaded), including superseded ones.
  std::size_t size() const;
  // Decisions held: one per target scope.
  std::size_t in_force() const;

 private:
  mutable std::mutex mu_;
  std::vector<gaugewatch::v1::Decision> decisions_;  // oldest first
  std::size_t added_ = 0;
};

}  // namespace gaugewatch::agent
