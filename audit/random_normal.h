#pragma once
// A seeded normal generator whose stream is the same on every platform
// (std::normal_distribution's is not specified): mt19937_64 + Box-Muller.

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>

namespace gaugewatch::audit {

class RandomNormal {
 public:
  explicit RandomNormal(uint64_t seed) : engine_(seed) {}

  double operator()() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = uniform_open();
    const double u2 = uniform_open();
    const double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = radius * std::sin(2.0 * std::numbers::pi * u2);
    has_spare_ = true;
    return radius * std::cos(2.0 * std::numbers::pi * u2);
  }

  double uniform_open() {  // (0, 1)
    return (static_cast<double>(engine_() >> 11) + 0.5) * 0x1.0p-53;
  }

 private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace gaugewatch::audit
