// gaugewatch: the command-line entry point. Verbs dispatch to their own files.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/audit_command.h"
#include "cli/run_command.h"

namespace {

constexpr const char* kUsage = R"(gaugewatch: keeps BF16 attention gradients honest.

usage: gaugewatch <command> [options]

commands:
  audit     run the CPU numerics reference (fp64, fp32, plain bf16, gproj, pivot)
            on a scenario or on captured operands; `gaugewatch audit --help`
  run       run a trainer with the hooks loaded: gaugewatch run [options] -- <command>
  help      this text
)";

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    std::fputs(kUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (args[0] == "audit") return gaugewatch::cli::run_audit_command(rest);
  if (args[0] == "run") return gaugewatch::cli::run_run_command(rest);
  std::fprintf(stderr, "gaugewatch: unknown command '%s'\n%s", args[0].c_str(), kUsage);
  return 2;
}
