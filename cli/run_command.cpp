#include "cli/run_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace gaugewatch::cli {
namespace {

constexpr const char* kUsage = R"(usage:
  gaugewatch run [options] -- <command> [args...]

Runs <command> with the gaugewatch hooks loaded (LD_PRELOAD), so that an
unchanged PyTorch trainer is monitored; works in front of torchrun and srun
(their workers inherit the environment). The command replaces this process:
its exit status is gaugewatch's. Examples:
  gaugewatch run -- python train.py
  gaugewatch run --run-id exp42 -- torchrun --nproc-per-node 8 train.py
  srun gaugewatch run -- python train.py

options (each sets the GAUGEWATCH_* variable named; docs/hooks.md):
  --lib PATH             libgaugewatch_hooks.so (default: $GAUGEWATCH_HOOKS_LIB,
                         else <gaugewatch's dir>/../lib/libgaugewatch_hooks.so)
  --socket PATH          agent unix socket            GAUGEWATCH_SOCKET
  --no-agent             no agent: local log only     GAUGEWATCH_SOCKET=none
  --run-id ID            run id                       GAUGEWATCH_RUN_ID
  --sample-every N       audit one step in N          GAUGEWATCH_SAMPLE_EVERY
  --layer-fraction F     layers per sampled step      GAUGEWATCH_LAYER_FRACTION
  --layers LIST          audit only these layers      GAUGEWATCH_LAYERS
  --max-heads N          slices per audit             GAUGEWATCH_MAX_HEADS
  --max-rows N           rows per slice               GAUGEWATCH_MAX_ROWS
  --overhead-budget F    audit time / step time       GAUGEWATCH_OVERHEAD_BUDGET
  --backend B            initial backend              GAUGEWATCH_BACKEND
  --layer-backends L     e.g. 1=gproj,3=fp32          GAUGEWATCH_LAYER_BACKENDS
  --capture-dir DIR      where captures go            GAUGEWATCH_CAPTURE_DIR
  --log-file FILE        copy of the hooks' log       GAUGEWATCH_LOG_FILE
  --stats-file FILE      stats JSON, every step       GAUGEWATCH_STATS_FILE
  --disable              load nothing, just run       GAUGEWATCH_DISABLE=1
)";

struct Flag {
  const char* flag;
  const char* variable;
};

constexpr Flag kFlags[] = {
    {"--socket", "GAUGEWATCH_SOCKET"},
    {"--run-id", "GAUGEWATCH_RUN_ID"},
    {"--sample-every", "GAUGEWATCH_SAMPLE_EVERY"},
    {"--layer-fraction", "GAUGEWATCH_LAYER_FRACTION"},
    {"--layers", "GAUGEWATCH_LAYERS"},
    {"--max-heads", "GAUGEWATCH_MAX_HEADS"},
    {"--max-rows", "GAUGEWATCH_MAX_ROWS"},
    {"--overhead-budget", "GAUGEWATCH_OVERHEAD_BUDGET"},
    {"--backend", "GAUGEWATCH_BACKEND"},
    {"--layer-backends", "GAUGEWATCH_LAYER_BACKENDS"},
    {"--capture-dir", "GAUGEWATCH_CAPTURE_DIR"},
    {"--log-file", "GAUGEWATCH_LOG_FILE"},
    {"--stats-file", "GAUGEWATCH_STATS_FILE"},
};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "gaugewatch run: %s\n\n%s", message.c_str(), kUsage);
  return 2;
}

std::string default_library() {
  if (const char* env = std::getenv("GAUGEWATCH_HOOKS_LIB"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "libgaugewatch_hooks.so";
  return (exe.parent_path().parent_path() / "lib" / "libgaugewatch_hooks.so").string();
}

}  // namespace

int run_run_command(const std::vector<std::string>& args) {
  std::string library;
  bool disable = false;
  std::vector<std::pair<std::string, std::string>> env;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--no-agent") {
      env.emplace_back("GAUGEWATCH_SOCKET", "none");
      continue;
    }
    if (a == "--disable") {
      disable = true;
      continue;
    }
    if (a == "--lib") {
      if (i + 1 >= args.size()) return usage_error("--lib needs a value");
      library = args[++i];
      continue;
    }
    bool known = false;
    for (const Flag& f : kFlags) {
      if (a == f.flag) {
        if (i + 1 >= args.size()) return usage_error(a + " needs a value");
        env.emplace_back(f.variable, args[++i]);
        known = true;
        break;
      }
    }
    if (!known) return usage_error("unknown option '" + a + "' (the command goes after --)");
  }
  if (i >= args.size()) return usage_error("no command given after --");

  for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
  if (disable) {
    ::setenv("GAUGEWATCH_DISABLE", "1", 1);
  } else {
    if (library.empty()) library = default_library();
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(library, ec);
    if (ec || !std::filesystem::is_regular_file(absolute, ec)) {
      std::fprintf(stderr, "gaugewatch run: %s not found (build it, or pass --lib / set GAUGEWATCH_HOOKS_LIB)\n",
                   library.c_str());
      return 2;
    }
    std::string preload = absolute.string();
    if (const char* old = std::getenv("LD_PRELOAD"); old != nullptr && *old != '\0') preload += std::string(":") + old;
    ::setenv("LD_PRELOAD", preload.c_str(), 1);
    ::setenv("GAUGEWATCH_HOOKS_LIB", absolute.c_str(), 1);
  }

  std::vector<char*> argv;
  for (std::size_t j = i; j < args.size(); ++j) argv.push_back(const_cast<char*>(args[j].c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "gaugewatch run: cannot run '%s': %s\n", argv[0], std::strerror(errno));
  return 127;
}

}  // namespace gaugewatch::cli
