#pragma once
// Warp-level BF16 tensor core primitives for sm_80+ (used on sm_90a): the
// m16n8k16 MMA with FP32 accumulators, ldmatrix loads of swizzled shared
// memory tiles, and cp.async global-to-shared copies.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16" for .bf16), lane = 4 g + c:
//   A (16x16, row-major): a0 (g, 2c..2c+1), a1 (g+8, 2c..), a2 (g, 2c+8..),
//                         a3 (g+8, 2c+8..)
//   B (16x8, K x N):      b0 (k 2c..2c+1, n g), b1 (k 2c+8.., n g)
//   C (16x8, FP32):       c0,c1 (g, 2c..2c+1), c2,c3 (g+8, 2c..2c+1)
// ldmatrix.x4 loads four 8x8 b16 matrices; lane l gives the row address of
// matrix l / 8, row l % 8, and register i receives matrix i with lane holding
// (row l / 4, cols 2 (l % 4)..+1); .trans delivers the transpose.
// stmatrix.x4 is its inverse: lane l gives the row address of matrix l / 8,
// row l % 8, and register i of every lane holds matrix i in the same layout,
// which is the layout of an accumulator's 8 x 8 blocks (C above, and the
// warpgroup MMAs' accumulators, wgmma.cuh): one instruction stores four
// blocks of BF16 pairs where 32-bit stores need four.
//
// Shared tiles are row-major [rows][W] BF16 with the 16-byte chunks of each
// row XOR-swizzled by (row % 8): an ldmatrix of 8 rows at one logical chunk
// then touches 8 distinct bank groups (no conflicts), for W a multiple of 64.

#include <cuda_runtime.h>

#include <cstdint>

#if !defined(GAUGEWATCH_CUDA_EMULATION)
#include <cuda_bf16.h>
#endif

namespace gaugewatch::gpu::mma {

// Element offset of (row, 16-byte chunk) in a swizzled [rows][W] tile.
template <int W>
__device__ __forceinline__ int swz(int row, int chunk) {
  static_assert(W % 64 == 0, "swizzle needs at least 8 chunks per row");
  return row * W + ((chunk ^ (row & 7)) << 3);
}

}  // namespace gaugewatch::gpu::mma

#if defined(GAUGEWATCH_CUDA_EMULATION)
// CI without a GPU: the same functions on the CPU emulation's warps
// (tests/cuda/emulation/bf16_mma_emulation.h).
#include "bf16_mma_emulation.h"
#else
namespace gaugewatch::gpu::mma {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void stmatrix_x4(void* p, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr(p)), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// c += a b (BF16 inputs, FP32 accumulate; the hardware rounds nothing but the
// final FP32 sums).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  // Not volatile: a pure function of its registers, free to be scheduled.
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared; zero-filled when !valid (rows past the end), so
// padding rows hold zeros rather than stale data.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
// 4 bytes global -> shared (through L1: .ca, the only caching mode for 4-byte
// copies), zero-filled when !valid. The row arrays of a tile are staged this
// way so that no thread waits on a global load before the tile is needed.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x = lo (low half)
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// 2^x as FlashAttention computes it (ex2.approx, flush-to-zero): the same
// instruction in every kernel, so P is bit-identical wherever it is rebuilt.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace gaugewatch::gpu::mma
#endif  // GAUGEWATCH_CUDA_EMULATION
