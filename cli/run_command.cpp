#include "cli/run_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "hooks/config.h"

namespace gaugewatch::cli {
namespace {

constexpr const char* kFooter = R"(
Runs <command> with the gaugewatch hooks loaded (LD_PRELOAD of
libgaugewatch_preload.so, which loads the hooks in Python processes only), so
that an unchanged PyTorch trainer is monitored; works in front of torchrun and
srun (their workers inherit the environment). The command replaces this process:
its exit status is gaugewatch's. Each option falls back to the GAUGEWATCH_*
variable it sets (docs/hooks.md). Examples:
  gaugewatch run -- python train.py
  gaugewatch run --run-id exp42 -- torchrun --nproc-per-node 8 train.py
  srun gaugewatch run -- python train.py)";

struct Flag {
  const char* flag;
  const char* variable;
  const char* type;
  const char* help;
};

constexpr Flag kFlags[] = {
    {"--socket", "GAUGEWATCH_SOCKET", "PATH", "agent unix socket"},
    {"--run-id", "GAUGEWATCH_RUN_ID", "ID", "run id ([A-Za-z0-9_.:-], at most 128; default: unique per launch)"},
    {"--sample-every", "GAUGEWATCH_SAMPLE_EVERY", "N", "audit one step in N (0: never)"},
    {"--layer-fraction", "GAUGEWATCH_LAYER_FRACTION", "F", "fraction of layers per sampled step, (0, 1]"},
    {"--layers", "GAUGEWATCH_LAYERS", "LIST", "audit only these layers, e.g. 0,3,7"},
    {"--max-heads", "GAUGEWATCH_MAX_HEADS", "N", "(batch, head) slices per audit"},
    {"--max-rows", "GAUGEWATCH_MAX_ROWS", "N", "query rows per slice"},
    {"--overhead-budget", "GAUGEWATCH_OVERHEAD_BUDGET", "F", "audit time / step time, (0, 1]"},
    {"--backend", "GAUGEWATCH_BACKEND", "B", "initial backend of every layer"},
    {"--layer-backends", "GAUGEWATCH_LAYER_BACKENDS", "L", "per-layer backends, e.g. 1=gproj,3=fp32"},
    {"--capture-dir", "GAUGEWATCH_CAPTURE_DIR", "DIR", "where operand captures go"},
    {"--log-file", "GAUGEWATCH_LOG_FILE", "FILE", "copy of the hooks' log"},
    {"--stats-file", "GAUGEWATCH_STATS_FILE", "FILE", "stats JSON, rewritten every step"},
};

const char* flag_of(const std::string& variable) {
  for (const Flag& f : kFlags) {
    if (variable == f.variable) return f.flag;
  }
  return "";
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "gaugewatch run: %s (gaugewatch run --help)\n", message.c_str());
  return 2;
}

std::string default_library() {
  if (const char* env = std::getenv("GAUGEWATCH_HOOKS_LIB"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "libgaugewatch_hooks.so";
  return (exe.parent_path().parent_path() / "lib" / "libgaugewatch_hooks.so").string();
}

// The first problem with the values, as the hooks would read them; "" if none.
std::string check_values(const std::map<std::string, std::string>& values) {
  std::vector<std::string> warnings;
  const hooks::HookConfig config = hooks::load_config(
      [&](const char* name) -> const char* {
        const auto it = values.find(name);
        return it == values.end() ? nullptr : it->second.c_str();
      },
      &warnings);
  if (!warnings.empty()) {
    // The hooks keep a default and carry on; the launcher refuses instead.
    std::string w = warnings.front();
    if (const auto cut = w.rfind("; "); cut != std::string::npos) w.resize(cut);
    for (const auto& [variable, value] : values) {
      if (w.find(variable) != std::string::npos) return std::string(flag_of(variable)) + ": " + w;
    }
    if (values.count("GAUGEWATCH_RUN_ID") != 0 && w.find("run id") != std::string::npos) return "--run-id: " + w;
    return w;
  }
  if (auto why = hooks::check_log_file(config.log_file); !why.empty()) return "--log-file: " + why;
  if (auto why = hooks::check_stats_file(config.stats_file); !why.empty()) return "--stats-file: " + why;
  if (!config.capture_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(config.capture_dir, ec);
    if (ec || ::access(config.capture_dir.c_str(), W_OK) != 0) {
      return "--capture-dir: " + config.capture_dir + " is not a writable directory" +
             (ec ? " (" + ec.message() + ")" : "");
    }
  }
  return "";
}

}  // namespace

CLI::App* add_run_command(CLI::App& app, RunOptions& options) {
  CLI::App* run = app.add_subcommand("run", "run a trainer with the hooks loaded: gaugewatch run [options] -- <command>");
  run->footer(kFooter);
  run->add_option("--lib", options.library,
                  "libgaugewatch_hooks.so (default: $GAUGEWATCH_HOOKS_LIB, else <gaugewatch's dir>/../lib/)")
      ->type_name("PATH");
  run->add_flag("--no-agent", options.no_agent, "no agent: local log only (GAUGEWATCH_SOCKET=none)");
  run->add_flag("--disable", options.disable, "load nothing, just run the command (GAUGEWATCH_DISABLE=1)");
  for (const Flag& f : kFlags) {
    run->add_option(f.flag, options.values[f.variable], f.help)->envname(f.variable)->type_name(f.type);
  }
  run->add_option("command", options.command, "the trainer command, after --")->type_name("");
  return run;
}

int run_run_command(const RunOptions& options) {
  if (options.command.empty()) return usage_error("no command given after --");
  std::map<std::string, std::string> values;
  for (const auto& [variable, value] : options.values) {
    if (!value.empty()) values[variable] = value;
  }
  if (options.no_agent) values["GAUGEWATCH_SOCKET"] = "none";
  // Without a run id, one unique to this launch, shared by every process it
  // starts (torchrun's or Slurm's id still comes first in the hooks).
  if (values.count("GAUGEWATCH_RUN_ID") == 0) {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    values["GAUGEWATCH_LAUNCH_ID"] =
        hooks::sanitize_run_id("run-" + hooks::unique_launch_suffix(host, static_cast<std::uint32_t>(::getpid())));
  }
  if (const std::string problem = check_values(values); !problem.empty()) return usage_error(problem);

  for (const auto& [name, value] : values) ::setenv(name.c_str(), value.c_str(), 1);
  if (options.disable) {
    ::setenv("GAUGEWATCH_DISABLE", "1", 1);
  } else {
    const std::string library = options.library.empty() ? default_library() : options.library;
    std::error_code ec;
    const std::filesystem::path absolute = std::filesystem::absolute(library, ec);
    if (ec || !std::filesystem::is_regular_file(absolute, ec)) {
      std::fprintf(stderr, "gaugewatch run: %s not found (build it, or pass --lib / set GAUGEWATCH_HOOKS_LIB)\n",
                   library.c_str());
      return 2;
    }
    // The shim beside the hooks library loads them in Python processes only
    // (hooks/preload_shim.c); without it every program the trainer starts
    // would map libtorch.
    const std::filesystem::path shim = absolute.parent_path() / "libgaugewatch_preload.so";
    std::string preload = absolute.string();
    if (std::filesystem::is_regular_file(shim, ec)) {
      preload = shim.string();
    } else {
      std::fprintf(stderr,
                   "gaugewatch run: %s not found beside the hooks library: preloading the hooks themselves, so "
                   "every program the trainer starts (compilers, shells) loads libtorch too\n",
                   shim.c_str());
    }
    if (const char* old = std::getenv("LD_PRELOAD"); old != nullptr && *old != '\0') preload += std::string(":") + old;
    ::setenv("LD_PRELOAD", preload.c_str(), 1);
    ::setenv("GAUGEWATCH_HOOKS_LIB", absolute.c_str(), 1);
  }

  std::vector<char*> argv;
  for (const std::string& a : options.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  std::fprintf(stderr, "gaugewatch run: cannot run '%s': %s\n", argv[0], std::strerror(errno));
  return 127;
}

}  // namespace gaugewatch::cli
