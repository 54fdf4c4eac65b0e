#pragma once
// Backend and enum spellings shared by the config, the CLI and the exporter.

#include <optional>
#include <string_view>

#include "gaugewatch/v1/types.pb.h"

namespace gaugewatch::agent {

inline constexpr std::string_view kAgentVersion = "0.1.0";

// "stock", "gproj", "pivot", "fp32"; "unspecified" for BACKEND_UNSPECIFIED.
std::string_view backend_name(gaugewatch::v1::Backend backend);
// Inverse of backend_name for the four real backends; nullopt otherwise.
std::optional<gaugewatch::v1::Backend> parse_backend(std::string_view name);

}  // namespace gaugewatch::agent
