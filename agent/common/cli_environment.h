#pragma once
// Environment fallback for the CLI11 command lines of gaugewatch-agent and
// gaugewatchctl. CLI11 reads an option's variable (Option::envname) with
// std::getenv while it parses; these programs take their environment as a
// function instead (main passes std::getenv, tests a map, so a variable set
// in the shell that runs the tests cannot leak into them). The table of
// option -> variable lives here: applied after CLI11 parsed the flags (a flag
// beats its variable), through the option's own conversion and validators,
// and named in --help the way CLI11 names envname ("(Env:NAME)").

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace gaugewatch::agent {

// CLI::ExistingFile without its "FILE" label (the flag's type name says it).
inline CLI::Validator existing_file() { return CLI::Validator(CLI::ExistingFile).description(""); }

// Returns the variable's value, or nullptr when it is unset.
using Environment = std::function<const char*(const char*)>;

class EnvironmentFallback {
 public:
  // `option` falls back to `variable`; returns `option` for chaining.
  CLI::Option* bind(CLI::Option* option, std::string variable) {
    bindings_.emplace_back(option, std::move(variable));
    return option;
  }

  // Every bound option not given as a flag whose variable is set (and not
  // empty) takes the variable's value. Returns the options so filled. Throws
  // CLI::ValidationError naming the variable and its flag when the value is
  // refused by the option's validators or conversion.
  std::vector<CLI::Option*> apply(const Environment& env) const {
    std::vector<CLI::Option*> filled;
    for (const auto& [option, variable] : bindings_) {
      if (option->count() > 0) continue;
      const char* value = env(variable.c_str());
      if (value == nullptr || *value == '\0') continue;
      try {
        option->add_result(value);
        option->run_callback();
      } catch (const CLI::Error& e) {
        throw CLI::ValidationError(variable + " (for " + option->get_name() + ")", e.what());
      }
      filled.push_back(option);
    }
    return filled;
  }

  // Sets each bound option's envname, which CLI11's help formatter prints.
  // Call only after parsing (CLI11 would otherwise read std::getenv itself).
  void describe() const {
    for (const auto& [option, variable] : bindings_) option->envname(variable);
  }

  const std::string* variable_of(const CLI::Option* option) const {
    for (const auto& [bound, variable] : bindings_) {
      if (bound == option) return &variable;
    }
    return nullptr;
  }

 private:
  std::vector<std::pair<CLI::Option*, std::string>> bindings_;
};

}  // namespace gaugewatch::agent
