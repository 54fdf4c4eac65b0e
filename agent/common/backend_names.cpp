#include "agent/common/backend_names.h"

namespace gaugewatch::agent {

std::string_view backend_name(gaugewatch::v1::Backend backend) {
  const auto b = from_wire(backend);
  return b ? gaugewatch::backend_name(*b) : "unspecified";
}

std::optional<gaugewatch::v1::Backend> parse_backend(std::string_view name) {
  const auto b = gaugewatch::parse_backend(name);
  if (!b || backend_spec(*b).wire == 0) return std::nullopt;
  return static_cast<gaugewatch::v1::Backend>(backend_spec(*b).wire);
}

}  // namespace gaugewatch::agent
