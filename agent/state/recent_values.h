#pragma once
// The most recent values of one metric of a layer, oldest first (the status
// page's sparklines). A fixed ring: no allocation, 248 bytes per layer.

#include <array>
#include <cstdint>
#include <vector>

namespace gaugewatch::agent {

class RecentValues {
 public:
  static constexpr std::uint32_t kCapacity = 60;

  void add(double value) {
    values_[next_] = static_cast<float>(value);
    next_ = (next_ + 1) % kCapacity;
    if (count_ < kCapacity) ++count_;
  }

  std::vector<double> oldest_first() const {
    std::vector<double> out;
    out.reserve(count_);
    const std::uint32_t first = (next_ + kCapacity - count_) % kCapacity;
    for (std::uint32_t i = 0; i < count_; ++i) out.push_back(values_[(first + i) % kCapacity]);
    return out;
  }

 private:
  std::array<float, kCapacity> values_{};
  std::uint32_t next_ = 0;
  std::uint32_t count_ = 0;
};

}  // namespace gaugewatch::agent
