// gaugewatch: the command-line entry point (CLI11). Verbs dispatch to their own files.
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "cli/audit_command.h"
#include "cli/run_command.h"

#ifndef GAUGEWATCH_VERSION
#define GAUGEWATCH_VERSION "0.0.0"
#endif

int main(int argc, char** argv) {
  CLI::App app{"gaugewatch: keeps BF16 attention gradients honest."};
  app.set_version_flag("--version", "gaugewatch " GAUGEWATCH_VERSION);
  app.require_subcommand(1);
  // `audit` has its own parser (audit_command.cpp): everything after the verb goes to it.
  CLI::App* audit = app.add_subcommand(
      "audit", "run the CPU numerics reference (fp64, fp32, plain bf16, gproj, pivot) on a scenario or on "
               "captured operands; gaugewatch audit --help");
  audit->prefix_command();
  audit->set_help_flag();
  gaugewatch::cli::RunOptions run_options;
  CLI::App* run = gaugewatch::cli::add_run_command(app, run_options);
  CLI::App* help = app.add_subcommand("help", "this text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Help and --version exit 0; every other parse error is a usage error (2).
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  if (*help) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  if (*audit) return gaugewatch::cli::run_audit_command(audit->remaining());
  if (*run) return gaugewatch::cli::run_run_command(run_options);
  return 2;
}
