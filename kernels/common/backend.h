#pragma once
// The backends of an attention backward, as one table: every layer of the
// system (the hooks, the torch ops, the CUDA dispatch, the agent) names,
// parses and maps a backend through it. Header only, no dependencies.
//
//   name    the spelling everywhere: env vars, CLI flags, op arguments, stats,
//           Prometheus labels, logs
//   wire    gaugewatch.v1.Backend number (proto/gaugewatch/v1/types.proto;
//           checked at compile time in agent/common/backend_names.h); 0: not a
//           wire backend
//   reports the backend whose numerics it has, for the wire: "bf16" (the
//           fused kernel without projection) runs stock numerics
//   projection  the fused BF16 kernel's projection (kNone: no projection or
//           not a fused-kernel backend)
//   output  the dtype of the gradients gaugewatch::attention_backward returns
//   op      accepted by gaugewatch::attention_backward's `backend` argument
//   layer   a layer's backward can run it (the hooks, GAUGEWATCH_BACKEND,
//           SwitchBackend)
//   corrects  a correcting backend (docs/numerics.md): a layer that trips
//           the rule may be switched to it

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gaugewatch {

enum class Backend : std::uint8_t {
  kStock,   // the intercepted op's own backward (flash / cuDNN / efficient / CPU flash)
  kGproj,   // fused BF16 backward with the GProj projection
  kPivot,   // fused BF16 backward with the pivot projection
  kFp32,    // FP32 recompute, cast back to the input dtype by the hooks
  kBf16,    // fused BF16 backward without a projection: the stock numerics, for measuring
  kCenter,  // the stock backward on centred keys (docs/numerics.md, "Centring")
  kFp64,    // FP64 ground truth, CPU only (tests, the audit)
};

enum class Projection : std::uint8_t { kNone, kGproj, kPivot };
enum class OutputDtype : std::uint8_t { kBfloat16, kFloat32, kFloat64 };

struct BackendSpec {
  Backend id;
  std::string_view name;
  int wire;
  Backend reports;
  Projection projection;
  OutputDtype output;
  bool op;
  bool layer;
  bool corrects;
};

inline constexpr std::array<BackendSpec, 7> kBackends{{
    // id               name      wire reports            projection           output                op     layer  corrects
    {Backend::kStock, "stock", 1, Backend::kStock, Projection::kNone, OutputDtype::kBfloat16, false, true, false},
    {Backend::kGproj, "gproj", 2, Backend::kGproj, Projection::kGproj, OutputDtype::kBfloat16, true, true, true},
    {Backend::kPivot, "pivot", 3, Backend::kPivot, Projection::kPivot, OutputDtype::kBfloat16, true, true, true},
    {Backend::kFp32, "fp32", 4, Backend::kFp32, Projection::kNone, OutputDtype::kFloat32, true, true, true},
    {Backend::kBf16, "bf16", 0, Backend::kStock, Projection::kNone, OutputDtype::kBfloat16, true, true, false},
    {Backend::kCenter, "center", 5, Backend::kCenter, Projection::kNone, OutputDtype::kBfloat16, true, true, true},
    {Backend::kFp64, "fp64", 0, Backend::kFp64, Projection::kNone, OutputDtype::kFloat64, true, false, false},
}};

namespace backend_table_detail {
constexpr bool rows_in_enum_order() {
  for (std::size_t i = 0; i < kBackends.size(); ++i) {
    if (static_cast<std::size_t>(kBackends[i].id) != i) return false;
  }
  return true;
}
}  // namespace backend_table_detail
static_assert(backend_table_detail::rows_in_enum_order(), "kBackends: one row per Backend, in enum order");

inline constexpr std::size_t kBackendCount = kBackends.size();

constexpr const BackendSpec& backend_spec(Backend b) { return kBackends[static_cast<std::size_t>(b)]; }
constexpr std::string_view backend_name(Backend b) { return backend_spec(b).name; }

constexpr std::optional<Backend> parse_backend(std::string_view name) {
  for (const BackendSpec& s : kBackends) {
    if (s.name == name) return s.id;
  }
  return std::nullopt;
}

// The wire number a backend is reported as (bf16: stock's).
constexpr int reported_wire(Backend b) { return backend_spec(backend_spec(b).reports).wire; }

// The backend of a wire number; nullopt for 0 and unknown numbers.
constexpr std::optional<Backend> backend_from_wire(int wire) {
  if (wire == 0) return std::nullopt;
  for (const BackendSpec& s : kBackends) {
    if (s.wire == wire) return s.id;
  }
  return std::nullopt;
}

// "a|b|c": the names of the backends whose spec satisfies `pred`, for messages.
template <typename Pred>
std::string backend_names(Pred pred) {
  std::string out;
  for (const BackendSpec& s : kBackends) {
    if (!pred(s)) continue;
    if (!out.empty()) out += '|';
    out += s.name;
  }
  return out;
}

}  // namespace gaugewatch
