#pragma once
// A token bucket: `rate` tokens per second, at most `burst` banked. Used per
// trainer stream to bound incoming samples; take() never blocks, it says how
// many of the asked tokens are granted now. Not thread-safe: each stream's
// bucket is touched only by that stream's reader thread.

#include <algorithm>
#include <cstdint>

namespace gaugewatch::agent {

class TokenBucket {
 public:
  // rate <= 0: unlimited (every take is granted in full).
  TokenBucket(double rate_per_second, double burst, std::int64_t now_ns)
      : rate_(rate_per_second), burst_(burst), tokens_(burst), last_ns_(now_ns) {}

  bool unlimited() const { return rate_ <= 0.0; }

  // Grants min(wanted, whole tokens available) and spends them.
  std::uint64_t take(std::uint64_t wanted, std::int64_t now_ns) {
    if (unlimited()) return wanted;
    if (now_ns > last_ns_) {
      tokens_ = std::min(burst_, tokens_ + rate_ * static_cast<double>(now_ns - last_ns_) / 1e9);
      last_ns_ = now_ns;
    }
    const double whole = tokens_ >= 1.0 ? static_cast<double>(static_cast<std::uint64_t>(tokens_)) : 0.0;
    const std::uint64_t granted =
        std::min<std::uint64_t>(wanted, static_cast<std::uint64_t>(whole));
    tokens_ -= static_cast<double>(granted);
    return granted;
  }

  double tokens() const { return tokens_; }

 private:
  double rate_;
  double burst_;
  double tokens_;
  std::int64_t last_ns_;
};

}  // namespace gaugewatch::agent
