#pragma once
// Hopper warpgroup MMA (wgmma.mma_async, sm_90a) for the fused BF16 backward:
// shared-memory matrix descriptors for the 128-byte swizzle, the m64n64k16
// and m64n128k16 BF16 -> FP32 instructions (and m64n8k16, both in shared
// memory, for row sums against a tile of ones, and m64n32k16 for the dQ
// column halves at D = 64) (both operands in shared memory,
// "ss", or A in registers, "rs"), the fences and barriers around them, and
// the store of an accumulator to an operand tile (store_accumulator_tile).
//
// Tile layout (tile_offset): a [R][W] BF16 tile is stored as W / 64 sub-tiles
// [R][64], each row 128 bytes, the 16-byte chunk c of row r stored at chunk
// c ^ (r % 8). Tiles start 1024-byte aligned. This is the hardware's 128-byte
// swizzle (address bits 4-6 XOR bits 7-9), so the same tile is a legal wgmma
// operand read either way:
//   K-major  (the contraction index runs along the 64-wide rows): one core
//            group is 8 rows x 128 bytes; SBO = 1024 bytes between groups of
//            8 rows; step k16 advances the start address by 32 bytes inside
//            the row, and by one sub-tile every 64 columns.
//   MN-major (the contraction index runs down the rows): 16 rows per k16
//            step, SBO = 1024 bytes between the two groups of 8 rows; LBO =
//            the sub-tile stride between 64-wide column blocks of M or N.
//            Step k16 advances the start address by 16 rows (2048 bytes).
// Descriptor bits (PTX ISA, "Matrix Descriptor"): start address >> 4 in
// 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, base offset 0 (1024-byte
// aligned tiles), swizzle mode 1 (128 B) in 62-63.
//
// Fragments (per warp w = warp index % 4 of the warpgroup, lane = 4 g + c):
//   accumulator m64nN, float d[N / 2]: d[4 j + 0, 1] = (row 16 w + g,
//     cols 8 j + 2 c, +1), d[4 j + 2, 3] = (row 16 w + g + 8, same cols);
//   A in registers (rs), m64k16: a[0] = (16 w + g, 2 c..+1), a[1] = (16 w +
//     g + 8, 2 c..), a[2] = (16 w + g, 2 c + 8..), a[3] = (16 w + g + 8,
//     2 c + 8..): the accumulator's columns 16 k.. 16 k + 15 packed to BF16
//     pairs are the A operand of step k (accumulator_to_a).
// The instructions are asynchronous: fence() before the first of a batch
// (registers written since), commit() after it, wait<N>() before the
// accumulators are read; operand fences keep the compiler from moving
// register reads across the wait. Shared memory written by threads
// (st.shared, cp.async) is made visible to wgmma with fence_proxy_async()
// by the writers, then a barrier.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/bf16_mma.cuh"

namespace gaugewatch::gpu::wgmma {

inline constexpr int kWarpgroupThreads = 128;

// Element offset of (row, col) in a [R][W] tile (layout above).
template <int R>
__device__ __forceinline__ int tile_offset(int row, int col) {
  return (col >> 6) * (R * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// Element offset of the 16-byte chunk `chunk` (8 columns) of row `row`.
template <int R>
__device__ __forceinline__ int chunk_offset(int row, int chunk) {
  return (chunk >> 3) * (R * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

// Descriptor fields other than the start address.
__host__ __device__ constexpr uint64_t desc_bits(uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3fffu) << 32) | (uint64_t{1} << 62);
}
inline constexpr uint32_t kGroupBytes = 1024;  // 8 rows x 128 bytes

// The descriptor of the operand `bytes` (a multiple of 16) past the one
// `desc` describes. The start address field is bits 0-13 of the low word and
// a shared-memory address (below 228 KiB) shifted right by 4 stays below
// 2^14, so the sum is a 32-bit add to the low word that never carries into
// LBO: with the operand's base descriptor formed once, each k16 step's
// descriptor is one add of a constant (ptxas: one uniform-register add),
// not an address conversion, shift, mask and two moves.
__host__ __device__ __forceinline__ uint64_t desc_plus(uint64_t desc, uint32_t bytes) {
  return (desc & 0xffffffff00000000ull) | static_cast<uint32_t>(static_cast<uint32_t>(desc) + (bytes >> 4));
}

// The first 1024-byte aligned address at or after p: kernels round their
// dynamic shared memory up with it (and allocate 1024 bytes more), so every
// tile is aligned whatever the runtime's base alignment. The emulation's
// descriptors count from the same rounded base. The result is p plus a
// padding (pointer arithmetic, not an integer round trip), so the compiler
// still knows it points into shared memory: every access through it is an
// ld/st.shared with a 32-bit address, not a generic one.
template <class T>
__host__ __device__ __forceinline__ T* align_1024(T* p) {
  const uintptr_t pad = (uintptr_t{1024} - (reinterpret_cast<uintptr_t>(p) & uintptr_t{1023})) & uintptr_t{1023};
  return reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(p) + pad);
}

}  // namespace gaugewatch::gpu::wgmma

#if defined(GAUGEWATCH_CUDA_EMULATION)
// CI without a GPU: the same functions on the CPU emulation's warps
// (tests/cuda/emulation/wgmma_emulation.h).
#include "wgmma_emulation.h"
#else
namespace gaugewatch::gpu::wgmma {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Operand whose contraction index runs along the 64-wide rows.
__device__ __forceinline__ uint64_t desc_k_major(const void* p) {
  return desc_bits(16, kGroupBytes) | ((smem_u32(p) >> 4) & 0x3fffu);
}

// Operand whose contraction index runs down the rows; lbo_bytes = stride
// between the tile's 64-wide column blocks.
__device__ __forceinline__ uint64_t desc_mn_major(const void* p, uint32_t lbo_bytes) {
  return desc_bits(lbo_bytes, kGroupBytes) | ((smem_u32(p) >> 4) & 0x3fffu);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
template <int F>
__device__ __forceinline__ void fence_operand(float (&d)[F]) {
#pragma unroll
  for (int i = 0; i < F; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// After wait<0>(), before this thread rewrites a shared tile that its
// warpgroup's MMAs read, with no barrier between: nothing on the GPU, where
// the wait covers the whole warpgroup's MMAs (a collective operation, done
// for all four warps); the emulation, which runs each thread's share of an
// MMA at that thread's call, waits here for the warpgroup's other threads.
__device__ __forceinline__ void warpgroup_reads_done() {}
// Barrier of one warpgroup (ids 1.. ; 0 is __syncthreads).
__device__ __forceinline__ void warpgroup_barrier(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kWarpgroupThreads) : "memory");
}
// Barrier `id` of kCount threads (whole warps), e.g. the two compute
// warpgroups of a warp-specialized block, whose producer never joins it.
template <int kCount>
__device__ __forceinline__ void named_barrier(int id) {
  static_assert(kCount % 32 == 0, "bar.sync: whole warps");
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kCount) : "memory");
}
// Arrival at barrier `id` of kCount threads without waiting (bar.arrive): the
// producer side of a hand-over whose consumer calls named_barrier<kCount>(id);
// this thread's earlier memory accesses are performed for the threads that
// pass the barrier (PTX ISA, "bar, barrier": release / acquire).
template <int kCount>
__device__ __forceinline__ void named_barrier_arrive(int id) {
  static_assert(kCount % 32 == 0, "bar.arrive: whole warps");
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kCount) : "memory");
}

// Pingpong between the two warpgroups of a 256-thread block: warpgroup 0
// calls pingpong_arrive(id) once it has issued a batch of MMAs, warpgroup 1
// pingpong_wait(id) before issuing its own. The tensor cores (shared by the
// two, one per SM quarter) then run warpgroup 0's batch first, and each
// warpgroup's softmax-style element work overlaps the other's MMAs instead of
// both idling the tensor cores at once. Scheduling only: no data passes.
__device__ __forceinline__ void pingpong_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(2 * kWarpgroupThreads) : "memory");
}
__device__ __forceinline__ void pingpong_wait(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(2 * kWarpgroupThreads) : "memory");
}

// d (m64 x N) += A (m64 x k16) B (k16 x N). kTransA / kTransB: the operand is
// MN-major (otherwise K-major).
template <bool kTransA, bool kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
}

// m64n32k16: d (m64 x 32) += A (m64 x k16) B (k16 x 32), both operands in
// shared memory. An N = 32 operand that is MN-major starts 0 or 64 bytes into
// the 128-byte rows of its tile: the swizzle is of the address, so the half
// row is read like the whole (the warp-specialized kernel's dQ at D = 64, each
// warpgroup 32 of the 64 columns).
template <bool kTransA, bool kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, %19, %20;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
}

template <bool kTransA, bool kTransB>
__device__ __forceinline__ void mma_ss_first(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
      "}, %16, %17, p, 1, 1, %19, %20;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(0), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
}

// m64n8k16: d (m64 x 8) += A (m64 x k16) B (k16 x 8), both operands in
// shared memory; with B all ones every column of d is A's row sums (exact
// BF16 products, FP32 accumulation).
template <bool kTransA, bool kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, %7, %8;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
}
template <bool kTransA, bool kTransB>
__device__ __forceinline__ void mma_ss_first(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, %7, %8;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(0), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
}

// m64n8k16 with A in registers (the accumulator_to_a fragments of a tile);
// with B all ones every column of d is A's row sums.
template <bool kTransB>
__device__ __forceinline__ void mma_rs(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, %10;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(kTransB ? 1 : 0));
}
template <bool kTransB>
__device__ __forceinline__ void mma_rs_first(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, %10;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(0), "n"(kTransB ? 1 : 0));
}

// d = A B, the first k step of a product: scale-d 0, so the accumulator's
// previous values are neither read nor need zeroing. Zeroing moves would sit
// between the fence and the MMA, where ptxas serializes around them
// (warpgroup.arrive / warpgroup.wait injected).
template <bool kTransA, bool kTransB>
__device__ __forceinline__ void mma_ss_first(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(0), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
}

template <bool kTransB>
__device__ __forceinline__ void mma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(kTransB ? 1 : 0));
}

template <bool kTransA, bool kTransB>
__device__ __forceinline__ void mma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(1), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
}

template <bool kTransA, bool kTransB>
__device__ __forceinline__ void mma_ss_first(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(0), "n"(kTransA ? 1 : 0), "n"(kTransB ? 1 : 0));
}

template <bool kTransB>
__device__ __forceinline__ void mma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1), "n"(kTransB ? 1 : 0));
}

}  // namespace gaugewatch::gpu::wgmma
#endif  // GAUGEWATCH_CUDA_EMULATION

namespace gaugewatch::gpu::wgmma {

// The descriptors of BF16 element `offset` of the tile at `base` (the
// operand's base descriptor, which the compiler forms once for every k16
// step of the same base, plus the offset: desc_plus).
__device__ __forceinline__ uint64_t desc_k_major(const uint16_t* base, int offset) {
  return desc_plus(desc_k_major(base), 2u * static_cast<uint32_t>(offset));
}
__device__ __forceinline__ uint64_t desc_mn_major(const uint16_t* base, int offset, uint32_t lbo_bytes) {
  return desc_plus(desc_mn_major(base, lbo_bytes), 2u * static_cast<uint32_t>(offset));
}

// Accumulator columns 16 k .. 16 k + 15 of an m64n64 accumulator, rounded to
// BF16 pairs, as the A operand of step k (the fragment layout above).
__device__ __forceinline__ void accumulator_to_a(uint32_t (&frag)[4][4], const float (&x)[32]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
#pragma unroll
    for (int q = 0; q < 4; ++q) frag[k][q] = mma::pack_bf16(x[8 * k + 2 * q], x[8 * k + 2 * q + 1]);
  }
}

// An m64n64 accumulator x (this thread: warp v of its warpgroup, lane l)
// packed to BF16 pairs into a [64 rows][64 columns] tile (tile_offset
// layout), where it is an MMA operand read either way: four stmatrix.x4,
// each the 8 x 8 blocks (column block jn, row half hh) of a pair of column
// blocks, (2p, 0), (2p, 1), (2p + 1, 0), (2p + 1, 1), whose registers are the
// accumulator's pairs x[4 jn + 2 hh], +1 (the fragment layout above); lane l
// gives the address of row l % 8 of block l / 8. One instruction per four
// 32-bit stores, and the four addresses are the same for every tile the
// thread stores.
__device__ __forceinline__ void store_accumulator_tile(uint16_t* tile, const float (&x)[32], int v, int lane) {
  const int block = lane >> 3, row = 16 * v + 8 * (block & 1) + (lane & 7);
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const uint32_t r[4] = {mma::pack_bf16(x[8 * p], x[8 * p + 1]), mma::pack_bf16(x[8 * p + 2], x[8 * p + 3]),
                           mma::pack_bf16(x[8 * p + 4], x[8 * p + 5]), mma::pack_bf16(x[8 * p + 6], x[8 * p + 7])};
    mma::stmatrix_x4(tile + tile_offset<64>(row, 8 * (2 * p + (block >> 1))), r);
  }
}
// The same tile from the accumulator already packed to A fragments
// (accumulator_to_a: frag[p] holds the pairs store_accumulator_tile packs
// for its p).
__device__ __forceinline__ void store_fragment_tile(uint16_t* tile, const uint32_t (&frag)[4][4], int v, int lane) {
  const int block = lane >> 3, row = 16 * v + 8 * (block & 1) + (lane & 7);
#pragma unroll
  for (int p = 0; p < 4; ++p) mma::stmatrix_x4(tile + tile_offset<64>(row, 8 * (2 * p + (block >> 1))), frag[p]);
}

}  // namespace gaugewatch::gpu::wgmma
