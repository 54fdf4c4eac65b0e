#pragma once
// The switch decisions in force, in memory: the newest decision whose target
// covers (run, rank, layer) names that layer's desired backend.

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "gaugewatch/v1/admin_service.pb.h"

namespace gaugewatch::agent {

bool target_covers(const gaugewatch::v1::Target& target, const std::string& run_id,
                   std::uint32_t rank, std::uint32_t layer);
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
  std::size_t size() const;

 private:
  mutable std::mutex mu_;
  std::vector<gaugewatch::v1::Decision> decisions_;  // oldest first
};

}  // namespace gaugewatch::agent
