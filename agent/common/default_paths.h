#pragma once
// Where the agent's socket and database live when nobody says otherwise, as
// the agent, gaugewatchctl and the hooks library all resolve them (one
// header, no dependencies, so every part finds the agent the same way):
//
//   root:        /run/gaugewatch/agent.sock         /var/lib/gaugewatch/agent.db
//   other users: $XDG_RUNTIME_DIR/gaugewatch/agent.sock
//                (/tmp/gaugewatch-<uid>/agent.sock without XDG_RUNTIME_DIR)
//                $XDG_STATE_HOME/gaugewatch/agent.db
//                ($HOME/.local/state/gaugewatch/agent.db without XDG_STATE_HOME)
//
// An explicit setting (flag, environment variable, config file) wins over
// these everywhere.

#include <unistd.h>

#include <cstdlib>
#include <string>

namespace gaugewatch {

struct DefaultPaths {
  std::string socket;
  std::string database;
  const char* basis;  // "root" or "user": which rule chose them
};

// `env` returns nullptr for unset variables (std::getenv by default).
template <typename Env>
DefaultPaths default_paths(unsigned effective_uid, Env env) {
  if (effective_uid == 0) {
    return {"/run/gaugewatch/agent.sock", "/var/lib/gaugewatch/agent.db", "root"};
  }
  const auto set = [&](const char* name) -> std::string {
    const char* value = env(name);
    return value != nullptr && value[0] == '/' ? std::string(value) : std::string();
  };
  DefaultPaths paths{"", "", "user"};
  const std::string runtime = set("XDG_RUNTIME_DIR");
  paths.socket = runtime.empty() ? "/tmp/gaugewatch-" + std::to_string(effective_uid) + "/agent.sock"
                                 : runtime + "/gaugewatch/agent.sock";
  std::string state = set("XDG_STATE_HOME");
  if (state.empty()) {
    const std::string home = set("HOME");
    state = (home.empty() ? "/tmp/gaugewatch-" + std::to_string(effective_uid) : home + "/.local/state");
  }
  paths.database = state + "/gaugewatch/agent.db";
  return paths;
}

inline DefaultPaths default_paths() {
  return default_paths(static_cast<unsigned>(::geteuid()), [](const char* name) { return std::getenv(name); });
}

}  // namespace gaugewatch
