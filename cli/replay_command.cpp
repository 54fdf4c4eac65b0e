#include "cli/replay_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <vector>

#ifndef GAUGEWATCH_SOURCE_DIR
#define GAUGEWATCH_SOURCE_DIR ""
#endif
#ifndef GAUGEWATCH_BUILD_PYTHON
#define GAUGEWATCH_BUILD_PYTHON ""
#endif

namespace gaugewatch::cli {

namespace fs = std::filesystem;

namespace {

fs::path executable_dir() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : self.parent_path();
}

// The replay script: installed beside the binary's prefix
// (<prefix>/share/gaugewatch/tools), else the source tree this binary was
// built from.
fs::path find_tool() {
  const fs::path bin = executable_dir();
  for (const fs::path& candidate : {bin / ".." / "share" / "gaugewatch" / "tools" / "replay_capture.py",
                                    fs::path(GAUGEWATCH_SOURCE_DIR) / "tools" / "replay_capture.py"}) {
    std::error_code ec;
    if (!candidate.empty() && fs::is_regular_file(candidate, ec)) return fs::weakly_canonical(candidate, ec);
  }
  return {};
}

// The Python with torch: $GAUGEWATCH_PYTHON, else the interpreter this build
// compiled the torch ops against, else python3 on PATH.
std::string find_python() {
  if (const char* env = std::getenv("GAUGEWATCH_PYTHON"); env && *env) return env;
  std::error_code ec;
  if (*GAUGEWATCH_BUILD_PYTHON && fs::exists(GAUGEWATCH_BUILD_PYTHON, ec)) return GAUGEWATCH_BUILD_PYTHON;
  return "python3";
}

}  // namespace

int run_replay(const ReplayOptions& o) {
  const fs::path tool = find_tool();
  if (tool.empty()) {
    std::cerr << "gaugewatch audit: --device needs tools/replay_capture.py, found neither in "
              << (executable_dir() / ".." / "share" / "gaugewatch" / "tools").string() << " nor in the source tree '"
              << GAUGEWATCH_SOURCE_DIR << "'; reinstall gaugewatch (cmake --install) or run from its build tree\n";
    return 1;
  }
  std::vector<std::string> args = {find_python(), tool.string(), "--input", o.input, "--device", o.device,
                                   "--repeat", std::to_string(o.repeat)};
  const fs::path ops = executable_dir() / ".." / "lib" / "libgaugewatch_ops.so";
  std::error_code ec;
  if (fs::exists(ops, ec)) {
    args.push_back("--ops-lib");
    args.push_back(fs::weakly_canonical(ops, ec).string());
  }
  if (o.json) args.push_back("--json");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  execvp(argv[0], argv.data());
  std::cerr << "gaugewatch audit: cannot run " << args[0] << " (" << std::strerror(errno)
            << "); set GAUGEWATCH_PYTHON to a Python with torch\n";
  return 1;
}

}  // namespace gaugewatch::cli
