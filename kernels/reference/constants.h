#pragma once
#include <numbers>

namespace gaugewatch::reference {
// exp(x) = exp2(x log2(e)): FlashAttention works in base 2 so the softmax is
// one FFMA and one EX2 per element.
inline constexpr float kLog2e = std::numbers::log2e_v<float>;
}  // namespace gaugewatch::reference
