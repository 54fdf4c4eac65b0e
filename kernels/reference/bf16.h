#pragma once
// BF16 rounding as the GPU does it: float -> bfloat16 with round-to-nearest-
// even (cvt.rn.bf16.f32, __float2bfloat16_rn), NaN kept quiet. BF16 values are
// carried in float, where they are exact, so the reference can round an FP32
// operand "to BF16" without a separate storage type.

#include <bit>
#include <cmath>
#include <cstdint>

namespace gaugewatch::reference {

// The upper 16 bits of an IEEE float, rounded to nearest even.
constexpr uint16_t float_to_bf16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

constexpr float bf16_bits_to_float(uint16_t bits) {
  return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
}

// round_bf16(x): the BF16 value nearest to x, as a float.
constexpr float round_bf16(float value) {
  return bf16_bits_to_float(float_to_bf16_bits(value));
}

constexpr bool is_bf16_exact(float value) { return round_bf16(value) == value || std::isnan(value); }

// BF16 unit roundoff u_b = 2^-8 (8 significand bits including the hidden one).
inline constexpr double kBf16UnitRoundoff = 1.0 / 256.0;

}  // namespace gaugewatch::reference
