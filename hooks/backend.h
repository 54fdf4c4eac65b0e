#pragma once
// The backward a layer runs (the wire's gaugewatch.v1.Backend plus the local
// "bf16" measuring backend, which the wire reports as stock numerics).

#include <cstdint>
#include <optional>
#include <string_view>

namespace gaugewatch::hooks {

enum class Backend : std::uint8_t {
  kStock,  // the intercepted op's own backward (flash / cuDNN / efficient / CPU flash)
  kGproj,  // gaugewatch::attention_backward backend "gproj"
  kPivot,  // "pivot"
  kFp32,   // "fp32" (FP32 recompute, cast back to the input dtype)
  kBf16,   // "bf16": the fused BF16 kernel without projection (stock numerics, for measuring)
};
inline constexpr int kBackendCount = 5;

inline constexpr std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::kStock: return "stock";
    case Backend::kGproj: return "gproj";
    case Backend::kPivot: return "pivot";
    case Backend::kFp32: return "fp32";
    case Backend::kBf16: return "bf16";
  }
  return "stock";
}

inline std::optional<Backend> parse_backend(std::string_view name) {
  for (int i = 0; i < kBackendCount; ++i) {
    const auto b = static_cast<Backend>(i);
    if (backend_name(b) == name) return b;
  }
  return std::nullopt;
}

// gaugewatch.v1.Backend numbers (types.proto): STOCK 1, GPROJ 2, PIVOT 3, FP32 4.
inline int wire_backend(Backend b) {
  switch (b) {
    case Backend::kGproj: return 2;
    case Backend::kPivot: return 3;
    case Backend::kFp32: return 4;
    default: return 1;
  }
}

inline std::optional<Backend> from_wire_backend(int value) {
  switch (value) {
    case 1: return Backend::kStock;
    case 2: return Backend::kGproj;
    case 3: return Backend::kPivot;
    case 4: return Backend::kFp32;
    default: return std::nullopt;
  }
}

}  // namespace gaugewatch::hooks
