// gaugewatch-agent's command line (CLI11): one flag per row of the settings
// table (config_options.h), each with its GAUGEWATCH_AGENT_* variable, plus
// --config, --check-config, --print-catalogue, --version and --help.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <deque>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "agent/common/backend_names.h"
#include "agent/common/cli_environment.h"
#include "agent/common/token_file.h"
#include "agent/config/agent_config.h"
#include "agent/config/config_options.h"

namespace gaugewatch::agent {

namespace {

constexpr const char* kDescription =
    "Per-node gaugewatch agent: receives attention gradient audits from training\n"
    "processes over gRPC, exports them on /metrics, runs switch rules, and keeps\n"
    "decisions and the audit log in SQLite. Runs with no file at all; a YAML file\n"
    "and flags override the embedded defaults. Precedence: flag > environment >\n"
    "file > default.\n";

constexpr const char* kFooter =
    "Exit status: 0 running then stopped by SIGTERM/SIGINT (or --check-config OK),\n"
    "1 cannot start, 2 configuration error.";

// Settings whose value names a file that must exist when given as a flag or
// variable (a typo is refused before anything starts).
bool names_a_file(std::string_view key) {
  return key == "tls_cert" || key == "tls_key" || key == "admin_token_file";
}

struct Setting {
  const ConfigOption* spec;
  CLI::Option* option;
  std::string value;
};

// The parser and what it fills. Built fresh for each parse (CLI11 keeps
// parse state in the App).
class AgentCommandLine {
 public:
  AgentCommandLine() : app_(kDescription, "gaugewatch-agent") {
    const AgentConfig defaults;
    app_.set_version_flag("--version", "gaugewatch-agent " + std::string(kAgentVersion),
                          "print the version and exit");
    app_.set_help_flag("-h,--help", "print this text and exit");
    app_.footer(kFooter);
    app_.get_formatter()->column_width(34);
    environment_.bind(
        app_.add_option("--config", config_path_,
                        "YAML configuration file (also holds rules, promql_rules, sampling, limits)")
            ->type_name("PATH")
            ->check(existing_file()),
        "GAUGEWATCH_AGENT_CONFIG");
    for (const auto& spec : config_options()) {
      Setting& setting = settings_.emplace_back(Setting{&spec, nullptr, {}});
      std::string help(spec.help);
      const std::string default_value = spec.get(defaults);
      help += default_value.empty() ? " (default: none)" : " (default: " + default_value + ")";
      setting.option = app_.add_option("--" + config_flag_name(spec.key), setting.value, help)
                           ->type_name(names_a_file(spec.key) ? "PATH" : "VALUE");
      if (names_a_file(spec.key)) setting.option->check(existing_file());
      environment_.bind(setting.option, config_env_name(spec.key));
    }
    app_.add_flag("--check-config", check_config_, "validate the configuration, print it, exit");
    app_.add_flag("--print-catalogue", print_catalogue_,
                  "print the exported metric catalogue (Markdown) and exit");
  }

  // Parses the flags, then the environment. Returns false for --help and
  // --version (recorded in `command_line`). Throws ConfigError.
  bool parse(const std::vector<std::string>& args, const Environment& env, CommandLine& command_line) {
    try {
      app_.parse(std::vector<std::string>(args.rbegin(), args.rend()));
      from_environment_ = environment_.apply(env);
    } catch (const CLI::CallForHelp&) {
      command_line.help = true;
      return false;
    } catch (const CLI::CallForVersion&) {
      command_line.version = true;
      return false;
    } catch (const CLI::ParseError& e) {
      throw ConfigError(std::string(e.what()) + " (see --help)");
    }
    command_line.check_config = check_config_;
    command_line.print_catalogue = print_catalogue_;
    return true;
  }

  // Defaults, then the YAML file, then the variables, then the flags.
  AgentConfig config() const {
    AgentConfig config;
    if (!config_path_.empty()) {
      apply_yaml(read_text_file(config_path_, "--config"), config);
      config.config_file = config_path_;
    }
    for (const Setting& setting : settings_) {
      if (from_environment(setting.option)) {
        setting.spec->set(config, setting.value, *environment_.variable_of(setting.option));
      }
    }
    for (const Setting& setting : settings_) {
      if (setting.option->count() > 0 && !from_environment(setting.option)) {
        setting.spec->set(config, setting.value, setting.option->get_name());
      }
    }
    return config;
  }

  std::string help() {
    environment_.describe();
    return app_.help();
  }

 private:
  bool from_environment(const CLI::Option* option) const {
    return std::find(from_environment_.begin(), from_environment_.end(), option) != from_environment_.end();
  }

  CLI::App app_;
  EnvironmentFallback environment_;
  std::string config_path_;
  std::deque<Setting> settings_;  // deque: CLI11 holds pointers to each value
  std::vector<CLI::Option*> from_environment_;
  bool check_config_ = false;
  bool print_catalogue_ = false;
};

}  // namespace

AgentConfig load_config(const std::vector<std::string>& args, const Environment& env,
                        CommandLine& command_line) {
  AgentCommandLine parser;
  if (!parser.parse(args, env, command_line)) return AgentConfig{};
  AgentConfig config = parser.config();
  if (!config.admin_token_file.empty()) {
    try {
      config.admin_token = token_from_file_contents(
          read_text_file(config.admin_token_file, "admin_token_file"), "admin_token_file");
    } catch (const std::invalid_argument& e) {
      throw ConfigError(e.what());
    }
  }
  return config;
}

std::string help_text() { return AgentCommandLine().help(); }

}  // namespace gaugewatch::agent
