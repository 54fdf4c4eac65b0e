// gaugewatchctl: operator CLI for gaugewatch-agent (see ctl_commands.h).

#include <cstdlib>
#include <iostream>

#include "agent/ctl/ctl_commands.h"

int main(int argc, char** argv) {
  return gaugewatch::agent::run_ctl(
      std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr,
      [](const char* name) -> const char* { return std::getenv(name); });
}
