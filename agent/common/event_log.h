#pragma once
// The agent's event log (spdlog): connections, disconnections, rule firings,
// decisions, commands, acknowledgements and rejections, with a level and a
// UTC timestamp on every line, as text or as one JSON object per line
// (--log-format json) for log shippers. Goes to stderr (journald under
// systemd). An operator follows an incident through this log alone.

#include <spdlog/logger.h>

#include <cstdint>
#include <mutex>
#include <string>

namespace gaugewatch::agent {

enum class LogFormat { kText, kJson };

// The process-wide event logger (text, level info until configured).
spdlog::logger& events();

// level: trace, debug, info, warn, error, critical, off. Throws
// std::invalid_argument naming the accepted values.
void configure_event_log(const std::string& level, LogFormat format);

// Admits at most `per_second` events per second (with a burst of as many);
// the ones it refuses are counted and reported by the next admitted one, so
// an abusive client cannot flood the log.
class LogRateLimit {
 public:
  explicit LogRateLimit(double per_second) : per_second_(per_second), tokens_(per_second) {}
  // True when this event may be logged; `suppressed` is set to the number of
  // events refused since the last admitted one.
  bool admit(std::uint64_t& suppressed);

 private:
  std::mutex mu_;
  const double per_second_;
  double tokens_;
  std::int64_t last_ns_ = 0;
  std::uint64_t suppressed_ = 0;
};

}  // namespace gaugewatch::agent
