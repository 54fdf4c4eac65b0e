#pragma once
// gaugewatchctl: the operator CLI over the AdminService. run_ctl is the whole
// program (main only forwards argv), so tests call it in-process.

#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace gaugewatch::agent {

// Exit codes.
inline constexpr int kCtlOk = 0;
inline constexpr int kCtlRpcError = 1;
inline constexpr int kCtlUsage = 2;

std::string ctl_help();

// `env` returns nullptr for unset variables.
int run_ctl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
            const std::function<const char*(const char*)>& env);

}  // namespace gaugewatch::agent
