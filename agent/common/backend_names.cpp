#include "agent/common/backend_names.h"

namespace gaugewatch::agent {

using gaugewatch::v1::Backend;

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case gaugewatch::v1::BACKEND_STOCK: return "stock";
    case gaugewatch::v1::BACKEND_GPROJ: return "gproj";
    case gaugewatch::v1::BACKEND_PIVOT: return "pivot";
    case gaugewatch::v1::BACKEND_FP32: return "fp32";
    default: return "unspecified";
  }
}

std::optional<Backend> parse_backend(std::string_view name) {
  if (name == "stock") return gaugewatch::v1::BACKEND_STOCK;
  if (name == "gproj") return gaugewatch::v1::BACKEND_GPROJ;
  if (name == "pivot") return gaugewatch::v1::BACKEND_PIVOT;
  if (name == "fp32") return gaugewatch::v1::BACKEND_FP32;
  return std::nullopt;
}

}  // namespace gaugewatch::agent
