#pragma once
// `gaugewatch run [options] -- <command> [args...]`: runs the command with
// libgaugewatch_hooks.so prepended to LD_PRELOAD and GAUGEWATCH_* set from the
// options (each falls back to its GAUGEWATCH_* variable), by exec (the
// command's exit status is the launcher's). Every value is checked first,
// with the hooks' own configuration parser, and the stats / log files must be
// writable: a bad one is a usage error (2) naming the flag.

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <vector>

namespace gaugewatch::cli {

struct RunOptions {
  std::string library;                        // --lib
  bool no_agent = false;                      // --no-agent
  bool disable = false;                       // --disable
  std::map<std::string, std::string> values;  // GAUGEWATCH_* variable -> value, from flags or the environment
  std::vector<std::string> command;
};

// Adds the `run` subcommand to `app`, parsing into `options`.
CLI::App* add_run_command(CLI::App& app, RunOptions& options);

// Checks `options` and execs the command; returns only on error: 2 usage
// error or missing library, 127 exec failure.
int run_run_command(const RunOptions& options);

}  // namespace gaugewatch::cli
