#pragma once
// The primitives of kernels/cuda/bf16_mma.cuh on the CPU emulation's warps, so
// the fused BF16 backward's own source runs in CI without a GPU. ldmatrix and
// mma.sync are warp-collective: every lane publishes its operands in the
// warp's scratch, a warp barrier, every lane reads what the PTX ISA says its
// registers receive, a second barrier. Fragment layouts as stated in
// bf16_mma.cuh. The MMA sums its 16 products in k order in FP32 on top of the
// accumulator (each BF16 x BF16 product is exact in FP32); the hardware's
// internal order may differ in the last bit, which the tests allow for.

#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

namespace gaugewatch::gpu::mma {

inline float bf16_bits_to_float(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

// float -> BF16 bits, round to nearest even (NaN stays NaN).
inline uint16_t float_to_bf16_bits(float x) {
  uint32_t u = 0;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline uint32_t pack_bf16(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16_bits(lo)) | (static_cast<uint32_t>(float_to_bf16_bits(hi)) << 16);
}

inline float round_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

inline float exp2_approx(float x) { return std::exp2(x); }

namespace emulated {

inline int lane_id() { return static_cast<int>(threadIdx.x % 32); }

// Register i of lane l after ldmatrix.x4: matrix i, row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 (transposed: rows 2 (l % 4), +1 at column l / 4).
inline void ldmatrix(uint32_t (&r)[4], const void* p, bool trans) {
  auto* rows = static_cast<const uint16_t**>(gaugewatch_emulation::warp_scratch());
  const int lane = lane_id(), g = lane >> 2, c = lane & 3;
  rows[lane] = static_cast<const uint16_t*>(p);
  gaugewatch_emulation::warp_barrier();
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (trans) {
      lo = rows[i * 8 + 2 * c][g];
      hi = rows[i * 8 + 2 * c + 1][g];
    } else {
      lo = rows[i * 8 + g][2 * c];
      hi = rows[i * 8 + g][2 * c + 1];
    }
    r[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  gaugewatch_emulation::warp_barrier();
}

// stmatrix.x4: lane l writes row l % 8 of matrix l / 8 at its own address,
// the row's column pairs taken from register l / 8 of lanes 4 (l % 8) ..
// 4 (l % 8) + 3.
inline void stmatrix(void* p, const uint32_t (&r)[4]) {
  auto* slots = static_cast<uint64_t*>(gaugewatch_emulation::warp_scratch());
  const int lane = lane_id();
  slots[lane] = reinterpret_cast<uint64_t>(p);
  for (int i = 0; i < 4; ++i) slots[32 + 4 * lane + i] = r[i];
  gaugewatch_emulation::warp_barrier();
  const int matrix = lane >> 3, row = lane & 7;
  uint32_t words[4];
  for (int c = 0; c < 4; ++c) words[c] = static_cast<uint32_t>(slots[32 + 4 * (4 * row + c) + matrix]);
  std::memcpy(p, words, sizeof words);
  gaugewatch_emulation::warp_barrier();
}

inline float half_of(uint32_t word, int k) {
  return bf16_bits_to_float(static_cast<uint16_t>((k & 1) ? (word >> 16) : (word & 0xffffu)));
}

}  // namespace emulated

inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) { emulated::ldmatrix(r, p, false); }
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) { emulated::ldmatrix(r, p, true); }
inline void stmatrix_x4(void* p, const uint32_t (&r)[4]) { emulated::stmatrix(p, r); }

inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  auto* slots = static_cast<uint32_t*>(gaugewatch_emulation::warp_scratch());
  const int lane = emulated::lane_id(), g = lane >> 2, cq = lane & 3;
  for (int i = 0; i < 4; ++i) slots[lane * 6 + i] = a[i];
  slots[lane * 6 + 4] = b0;
  slots[lane * 6 + 5] = b1;
  gaugewatch_emulation::warp_barrier();
  // A(row, k): lane 4 (row % 8) + (k % 8) / 2, register (row >= 8) + 2 (k >= 8).
  // B(k, n):   lane 4 n + (k % 8) / 2, register 4 + (k >= 8).
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * cq + (e & 1);
    float acc = c[e];
    for (int k = 0; k < 16; ++k) {
      const uint32_t aw = slots[(4 * (row % 8) + (k % 8) / 2) * 6 + (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)];
      const uint32_t bw = slots[(4 * col + (k % 8) / 2) * 6 + 4 + (k >= 8 ? 1 : 0)];
      acc += emulated::half_of(aw, k) * emulated::half_of(bw, k);
    }
    c[e] = acc;
  }
  gaugewatch_emulation::warp_barrier();
}

inline void cp_async_16(void* dst, const void* src, bool valid) {
  if (valid) {
    std::memcpy(dst, src, 16);
  } else {
    std::memset(dst, 0, 16);
  }
}
inline void cp_async_4(void* dst, const void* src, bool valid) {
  if (valid) {
    std::memcpy(dst, src, 4);
  } else {
    std::memset(dst, 0, 4);
  }
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}

}  // namespace gaugewatch::gpu::mma
