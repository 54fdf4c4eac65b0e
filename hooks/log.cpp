#include "hooks/log.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace gaugewatch::hooks {
namespace {

struct LogState {
  std::mutex mu;
  std::FILE* file = nullptr;
  std::set<std::string, std::less<>> once;
};

// Leaked on purpose: logging must work from static destructors and atexit.
LogState& state() {
  static auto* s = new LogState;
  return *s;
}

}  // namespace

std::string set_log_file(const std::string& path) {
  LogState& s = state();
  std::lock_guard lock(s.mu);
  if (s.file != nullptr || path.empty()) return "";
  s.file = std::fopen(path.c_str(), "a");
  if (s.file == nullptr) return "GAUGEWATCH_LOG_FILE=" + path + " cannot be written (" + std::strerror(errno) + ")";
  std::setvbuf(s.file, nullptr, _IOLBF, 0);
  return "";
}

void log_line(std::string_view message) {
  LogState& s = state();
  std::lock_guard lock(s.mu);
  const std::string line =
      "[gaugewatch-hooks " + std::to_string(::getpid()) + "] " + std::string(message) + "\n";
  std::fputs(line.c_str(), stderr);
  if (s.file != nullptr) std::fputs(line.c_str(), s.file);
}

bool log_once(std::string_view key, std::string_view message) {
  {
    LogState& s = state();
    std::lock_guard lock(s.mu);
    if (!s.once.emplace(key).second) return false;
  }
  log_line(message);
  return true;
}

void log_prepare_fork() { state().mu.lock(); }

void log_after_fork() { state().mu.unlock(); }

}  // namespace gaugewatch::hooks
