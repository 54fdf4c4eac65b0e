#pragma once
// The agent's scalar settings as one table: each is a YAML key, a flag
// (--key with '_' -> '-') and an environment variable (GAUGEWATCH_AGENT_KEY).
// The YAML reader (agent_config.cpp) and the command line
// (agent_command_line.cpp) both set values through it, so a value is checked
// the same way wherever it comes from.

#include <string>
#include <string_view>
#include <vector>

#include "agent/config/agent_config.h"

namespace gaugewatch::agent {

struct ConfigOption {
  std::string_view key;
  std::string_view help;
  std::string (*get)(const AgentConfig&);
  // Parses and range-checks `value`; throws ConfigError naming `what` (the
  // key, flag or variable the value came from).
  void (*set)(AgentConfig&, std::string_view value, std::string_view what);
};

const std::vector<ConfigOption>& config_options();
std::string config_flag_name(std::string_view key);  // "grpc_socket" -> "grpc-socket"
std::string config_env_name(std::string_view key);   // "grpc_socket" -> "GAUGEWATCH_AGENT_GRPC_SOCKET"

// The whole file; throws ConfigError naming `what` when it cannot be read.
std::string read_text_file(const std::string& path, std::string_view what);

}  // namespace gaugewatch::agent
