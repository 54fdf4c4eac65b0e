#pragma once
#include <string>
#include <vector>

namespace gaugewatch::cli {

// `gaugewatch run [options] -- <command> [args...]`: runs the command with
// libgaugewatch_hooks.so prepended to LD_PRELOAD and GAUGEWATCH_* set from the
// options, by exec (the command's exit status is the launcher's). Returns
// only on error: 2 usage error or missing library, 127 exec failure.
int run_run_command(const std::vector<std::string>& args);

}  // namespace gaugewatch::cli
