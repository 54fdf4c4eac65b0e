#include "agent/common/event_log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <stdexcept>

namespace gaugewatch::agent {

namespace {

// %j: the message as the body of a JSON string (quotes, backslashes and
// control characters escaped).
class JsonMessageFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*tm*/,
              spdlog::memory_buf_t& dest) override {
    static constexpr char kHex[] = "0123456789abcdef";
    for (const char ch : std::string_view(msg.payload.data(), msg.payload.size())) {
      const auto byte = static_cast<unsigned char>(ch);
      if (ch == '"' || ch == '\\') {
        dest.push_back('\\');
        dest.push_back(ch);
      } else if (byte < 0x20) {
        const char escaped[6] = {'\\', 'u', '0', '0', kHex[byte >> 4], kHex[byte & 15]};
        dest.append(escaped, escaped + 6);
      } else {
        dest.push_back(ch);
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

std::unique_ptr<spdlog::formatter> make_formatter(LogFormat format) {
  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  if (format == LogFormat::kJson) {
    formatter->add_flag<JsonMessageFlag>('j').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%fZ","level":"%l","logger":"%n","msg":"%j"})");
  } else {
    formatter->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %-5l %n: %v");
  }
  return formatter;
}

std::shared_ptr<spdlog::logger> create() {
  auto logger = std::make_shared<spdlog::logger>(
      "gaugewatch-agent", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_formatter(make_formatter(LogFormat::kText));
  logger->set_level(spdlog::level::info);
  logger->flush_on(spdlog::level::trace);
  return logger;
}

}  // namespace

spdlog::logger& events() {
  static const std::shared_ptr<spdlog::logger> logger = create();
  return *logger;
}

void configure_event_log(const std::string& level, LogFormat format) {
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    throw std::invalid_argument("log level '" + level +
                                "': expected trace, debug, info, warn, error, critical or off");
  }
  events().set_level(parsed);
  events().set_formatter(make_formatter(format));
}

bool LogRateLimit::admit(std::uint64_t& suppressed) {
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  std::lock_guard lock(mu_);
  if (last_ns_ != 0) {
    tokens_ = std::min(per_second_, tokens_ + per_second_ * static_cast<double>(now - last_ns_) / 1e9);
  }
  last_ns_ = now;
  if (tokens_ < 1.0) {
    ++suppressed_;
    return false;
  }
  tokens_ -= 1.0;
  suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

}  // namespace gaugewatch::agent
