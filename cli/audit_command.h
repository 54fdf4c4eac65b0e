#pragma once
#include <string>
#include <vector>

namespace gaugewatch::cli {

// `gaugewatch audit ...`; returns the process exit code (0 ok, 1 failed,
// 2 usage error). Writes the report to stdout and errors to stderr.
int run_audit_command(const std::vector<std::string>& args);

}  // namespace gaugewatch::cli
