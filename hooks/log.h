#pragma once
// Logging of the hooks library: one line per event to stderr (and to
// GAUGEWATCH_LOG_FILE when set), prefixed "[gaugewatch-hooks <pid>]".
// log_once() prints a given key only the first time: every failure path in
// code loaded into a trainer logs once and falls back, it never throws.

#include <string>
#include <string_view>

namespace gaugewatch::hooks {

// Opens GAUGEWATCH_LOG_FILE for appending; "" when it could (or `path` is
// empty), else what is wrong (the caller decides what that means).
std::string set_log_file(const std::string& path);
void log_line(std::string_view message);
// Logs `message` the first time `key` is seen; returns whether it logged.
bool log_once(std::string_view key, std::string_view message);
// fork: the log's lock is taken before and released after in both processes.
void log_prepare_fork();
void log_after_fork();

}  // namespace gaugewatch::hooks
