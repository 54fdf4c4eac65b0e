#include "agent/rules/escalation.h"

#include <algorithm>

#include "agent/common/backend_names.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

Escalation choose_backend(v1::Backend rule_backend,
                          const std::vector<v1::Backend>& correcting) {
  const auto has = [&](v1::Backend b) {
    return std::find(correcting.begin(), correcting.end(), b) != correcting.end();
  };
  const std::string rule_name(backend_name(rule_backend));
  if (correcting.empty()) {
    return {rule_backend, "hook reported no correcting backends; rule backend " + rule_name};
  }
  std::string listed;
  for (auto b : correcting) listed += (listed.empty() ? "" : ",") + std::string(backend_name(b));
  if (has(rule_backend)) {
    return {rule_backend, rule_name + " among the layer's correcting backends (" + listed + ")"};
  }
  if (rule_backend == v1::BACKEND_GPROJ && has(v1::BACKEND_CENTER)) {
    return {v1::BACKEND_CENTER,
            "gproj cannot correct this layer; center can (correcting backends: " + listed + ")"};
  }
  return {v1::BACKEND_UNSPECIFIED, "no correcting backend the rule allows can take this layer "
                                   "(rule backend " + rule_name + ", correcting backends: " +
                                       listed + "); not switched"};
}

}  // namespace gaugewatch::agent
