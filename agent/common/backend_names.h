#pragma once
// Backend spellings and wire numbers for the agent and the hooks' reporter:
// the one backend table (kernels/common/backend.h) seen through the wire
// enum gaugewatch.v1.Backend, whose numbers are checked against the table
// here at compile time.

#include <optional>
#include <string_view>

#include "gaugewatch/v1/types.pb.h"
#include "gaugewatch/version.h"
#include "kernels/common/backend.h"

namespace gaugewatch::agent {

inline constexpr std::string_view kAgentVersion = GAUGEWATCH_VERSION;

namespace backend_wire_detail {
// Every wire number of the table is a generated enum value, and every
// generated value but UNSPECIFIED has a table row.
constexpr bool table_matches_proto() {
  for (const BackendSpec& s : kBackends) {
    if (s.wire < 0 || s.wire > gaugewatch::v1::Backend_MAX) return false;
  }
  for (int w = 1; w <= gaugewatch::v1::Backend_MAX; ++w) {
    if (!backend_from_wire(w)) return false;
  }
  return gaugewatch::v1::Backend_MIN == gaugewatch::v1::BACKEND_UNSPECIFIED;
}
}  // namespace backend_wire_detail
static_assert(backend_wire_detail::table_matches_proto(), "kernels/common/backend.h and types.proto disagree");
static_assert(backend_spec(Backend::kStock).wire == gaugewatch::v1::BACKEND_STOCK);
static_assert(backend_spec(Backend::kGproj).wire == gaugewatch::v1::BACKEND_GPROJ);
static_assert(backend_spec(Backend::kPivot).wire == gaugewatch::v1::BACKEND_PIVOT);
static_assert(backend_spec(Backend::kFp32).wire == gaugewatch::v1::BACKEND_FP32);
static_assert(backend_spec(Backend::kCenter).wire == gaugewatch::v1::BACKEND_CENTER);

// The wire value a backend is reported as (bf16: stock numerics).
inline gaugewatch::v1::Backend to_wire(Backend backend) {
  return static_cast<gaugewatch::v1::Backend>(reported_wire(backend));
}
// The backend of a wire value; nullopt for UNSPECIFIED and unknown values.
inline std::optional<Backend> from_wire(gaugewatch::v1::Backend backend) {
  return backend_from_wire(static_cast<int>(backend));
}

// "stock", "gproj", "pivot", "fp32", "center"; "unspecified" for BACKEND_UNSPECIFIED
// (and values this build does not know).
std::string_view backend_name(gaugewatch::v1::Backend backend);
// Inverse of backend_name for the wire backends; nullopt otherwise.
std::optional<gaugewatch::v1::Backend> parse_backend(std::string_view name);

}  // namespace gaugewatch::agent
