#pragma once
// Bit-level element conversions shared by the kernels that run on the CPU
// emulation too (metrics_kernels.cuh, key_centring_kernels.cuh): one memcpy
// (register moves on the device, the same on the host) instead of an intrinsic
// per type behind #ifdef, and roundings to BF16 / FP16 written out, so the
// emulation rounds bit for bit as the GPU does. The packed pair roundings at
// the end are the exception: one instruction on the GPU where the written-out
// form costs ~10 per element, the same bits but for NaN payloads.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace gaugewatch::gpu::detail {

template <class To, class From>
__device__ __forceinline__ To bit_cast_to(From x) {
  static_assert(sizeof(To) == sizeof(From), "bit casts keep the size");
  To y;
  std::memcpy(&y, &x, sizeof y);
  return y;
}
__device__ __forceinline__ uint64_t double_bits(double x) { return bit_cast_to<uint64_t>(x); }
__device__ __forceinline__ double bits_double(uint64_t u) { return bit_cast_to<double>(u); }
__device__ __forceinline__ uint32_t float_bits(float x) { return bit_cast_to<uint32_t>(x); }
__device__ __forceinline__ float bits_float(uint32_t u) { return bit_cast_to<float>(u); }

__device__ __forceinline__ bool finite_float(float x) { return (float_bits(x) & 0x7f800000u) != 0x7f800000u; }

// float -> BF16 bits, round to nearest even, NaN kept quiet (reference/bf16.h).
__device__ __forceinline__ uint16_t bf16_bits_rne(float x) {
  const uint32_t bits = float_bits(x);
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// FP16 bits -> float (exact).
__device__ __forceinline__ float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return bits_float(float_bits(magnitude) | sign);
  }
  if (exponent == 31) return bits_float(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// float -> FP16 bits, round to nearest even (overflow to inf, NaN kept quiet).
__device__ __forceinline__ uint16_t half_bits_rne(float x) {
  const uint32_t bits = float_bits(x);
  const uint32_t sign = (bits >> 16) & 0x8000u, magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) return static_cast<uint16_t>(sign | (magnitude > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal, round(x 2^24) (exact scaling, RNE)
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(rintf(bits_float(magnitude) * 16777216.0f)));
  }
  uint32_t h = ((((magnitude >> 23) - 112u) << 10) | ((magnitude >> 13) & 0x3ffu));
  const uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // a carry moves into the exponent, as it should
  return static_cast<uint16_t>(sign | h);
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// Two floats rounded to BF16 / FP16 (RNE) and packed, `lo` in the low half.
// One cvt instruction on the GPU; on the host (and the CPU emulation) the
// roundings above. The bits agree for every input but a NaN: the GPU writes
// 0x7fff for any NaN (bf16_bits_rne maps the GPU's own arithmetic NaN,
// 0x7fffffff, to 0x7fff too; half_bits_rne writes 0x7e00).
__device__ __forceinline__ uint32_t bf16x2_bits_rne(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return static_cast<uint32_t>(bf16_bits_rne(lo)) | (static_cast<uint32_t>(bf16_bits_rne(hi)) << 16);
#endif
}
__device__ __forceinline__ uint32_t half2_bits_rne(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  uint32_t packed;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
  return packed;
#else
  return static_cast<uint32_t>(half_bits_rne(lo)) | (static_cast<uint32_t>(half_bits_rne(hi)) << 16);
#endif
}

}  // namespace gaugewatch::gpu::detail
