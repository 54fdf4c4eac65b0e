#pragma once
// The primitives of kernels/cuda/wgmma.cuh on the CPU emulation's threads, so
// kernels built on Hopper's warpgroup MMA run in CI without a GPU.
//
// Descriptors carry the real bit format (desc_bits), with the start address
// counted from the block's 1024-byte aligned dynamic shared memory (the base
// the kernels round up to with align_1024). The MMA decodes its operands from
// shared memory as the hardware does for the 128-byte swizzle: the logical
// byte address of element (mn, k) from start, LBO and SBO, then bits 4-6
// XORed with bits 7-9. A descriptor or tile layout that disagrees with the
// hardware therefore reads the wrong elements here too.
//
// Each MMA runs synchronously inside the call: fence, commit and wait are
// no-ops, so a missing fence or wait, or a tile overwritten while an MMA that
// reads it is still in flight, goes unnoticed here (only a GPU run can show
// it). Every thread computes its own accumulator elements at its own call
// (so a thread that rewrites an operand tile right after its wait calls
// warpgroup_reads_done() first; layout in wgmma.cuh), summing the 16
// products in k order in FP32 on top of the accumulator like mma_bf16's emulation (each BF16 x BF16 product is exact;
// the hardware's internal order may differ in the last bit). An A operand in
// registers (rs) is exchanged between the lanes of a warp through its scratch,
// bracketed by warp barriers; the ss form needs no exchange and no barrier.
// Descriptors other than wgmma.cuh's (another swizzle mode, a base offset)
// and operand reads outside the block's shared memory abort with a message.

// Included by kernels/cuda/wgmma.cuh after its common part (tile layout,
// desc_bits, align_1024), which this file builds on.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda_runtime.h"

namespace gaugewatch::gpu::wgmma {

namespace emulated {

[[noreturn]] inline void fail(const char* what, uint64_t value) {
  std::fprintf(stderr, "wgmma emulation: %s (0x%llx)\n", what, static_cast<unsigned long long>(value));
  std::abort();
}

// Byte 0 of the descriptors' address space: the aligned dynamic smem base.
inline const unsigned char* origin() {
  return reinterpret_cast<const unsigned char*>(align_1024(gaugewatch_emulation::dynamic_smem()));
}

// Bytes of dynamic smem from origin() on.
inline size_t origin_bytes() {
  const size_t skipped =
      static_cast<size_t>(origin() - reinterpret_cast<const unsigned char*>(gaugewatch_emulation::dynamic_smem()));
  const size_t total = gaugewatch_emulation::dynamic_smem_bytes();
  return total > skipped ? total - skipped : 0;
}

inline float bf16_to_float(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

// Element (mn, k) of an m/n x k16 operand in shared memory, by the hardware's
// address rule for its major-ness.
class Operand {
 public:
  Operand(uint64_t desc, bool mn_major)
      : base_(origin()),
        bytes_(origin_bytes()),
        start_(static_cast<uint32_t>(desc & 0x3fffu) << 4),
        lbo_(static_cast<uint32_t>((desc >> 16) & 0x3fffu) << 4),
        sbo_(static_cast<uint32_t>((desc >> 32) & 0x3fffu) << 4),
        mn_major_(mn_major) {
    // Only what wgmma.cuh builds is emulated: 128-byte swizzle, base offset 0.
    if ((desc >> 62) != 1) fail("descriptor swizzle mode is not 128 B (bits 62-63 != 1)", desc);
    if (((desc >> 49) & 7u) != 0) fail("descriptor base offset is not 0", desc);
  }

  float at(int mn, int k) const {
    const uint32_t m = static_cast<uint32_t>(mn), kk = static_cast<uint32_t>(k);
    uint32_t addr = mn_major_ ? start_ + (m / 64) * lbo_ + (kk / 8) * sbo_ + (kk % 8) * 128 + (m % 64) * 2
                              : start_ + (m / 8) * sbo_ + (m % 8) * 128 + kk * 2;
    addr ^= ((addr >> 7) & 7u) << 4;  // 128-byte swizzle: bits 4-6 ^= bits 7-9
    if (addr + 2 > bytes_) fail("operand element outside the block's dynamic shared memory", addr);
    uint16_t bits;
    std::memcpy(&bits, base_ + addr, sizeof bits);
    return bf16_to_float(bits);
  }

 private:
  const unsigned char* base_;
  size_t bytes_;
  uint32_t start_, lbo_, sbo_;
  bool mn_major_;
};

inline int warp_in_group() { return static_cast<int>((threadIdx.x / 32) % 4); }
inline int lane_id() { return static_cast<int>(threadIdx.x % 32); }

// a_rows[r][k]: A(row 16 w + g + 8 r, k) of this thread's two accumulator rows.
using ARows = float[2][16];

inline void a_rows_from_smem(ARows& rows, uint64_t desc_a, bool trans_a) {
  const Operand a(desc_a, trans_a);
  const int row0 = 16 * warp_in_group() + lane_id() / 4;
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < 16; ++k) rows[r][k] = a.at(row0 + 8 * r, k);
  }
}

// The m16n8k16 A fragment of the warp's 16 rows: A(row, k) sits in lane
// 4 (row % 8) + (k % 8) / 2, register (row >= 8) + 2 (k >= 8), low half for
// even k.
inline void a_rows_from_registers(ARows& rows, const uint32_t (&a)[4]) {
  auto* slots = static_cast<uint32_t*>(gaugewatch_emulation::warp_scratch());
  const int lane = lane_id(), g = lane / 4;
  for (int i = 0; i < 4; ++i) slots[lane * 4 + i] = a[i];
  gaugewatch_emulation::warp_barrier();
  for (int r = 0; r < 2; ++r) {
    for (int k = 0; k < 16; ++k) {
      const uint32_t word = slots[(4 * g + (k % 8) / 2) * 4 + r + (k >= 8 ? 2 : 0)];
      rows[r][k] = bf16_to_float(static_cast<uint16_t>((k & 1) ? (word >> 16) : (word & 0xffffu)));
    }
  }
  gaugewatch_emulation::warp_barrier();  // the scratch is free again
}

// d (this thread's part of m64 x N) += A B, B(k, n) = element (n, k) of desc_b.
template <int F>
void accumulate(float (&d)[F], const ARows& a, uint64_t desc_b, bool trans_b) {
  static_assert(F == 4 || F == 16 || F == 32 || F == 64,
                "wgmma.cuh has m64n8k16 (float[4]), m64n32k16 (float[16]), m64n64k16 (float[32]) and m64n128k16 "
                "(float[64])");
  const Operand b(desc_b, trans_b);
  const int c = lane_id() % 4;
  for (int j = 0; j < F / 4; ++j) {
    for (int h = 0; h < 2; ++h) {
      const int col = 8 * j + 2 * c + h;
      float bcol[16];
      for (int k = 0; k < 16; ++k) bcol[k] = b.at(col, k);
      for (int r = 0; r < 2; ++r) {
        float acc = d[4 * j + 2 * r + h];
        for (int k = 0; k < 16; ++k) acc += a[r][k] * bcol[k];
        d[4 * j + 2 * r + h] = acc;
      }
    }
  }
}

template <int F>
void mma_ss(float (&d)[F], uint64_t desc_a, bool trans_a, uint64_t desc_b, bool trans_b) {
  ARows a;
  a_rows_from_smem(a, desc_a, trans_a);
  accumulate(d, a, desc_b, trans_b);
}

template <int F>
void mma_rs(float (&d)[F], const uint32_t (&a_regs)[4], uint64_t desc_b, bool trans_b) {
  ARows a;
  a_rows_from_registers(a, a_regs);
  accumulate(d, a, desc_b, trans_b);
}

}  // namespace emulated

// The offset from the aligned dynamic smem base (see above), as the
// descriptors' start address field reads it.
inline uint32_t smem_u32(const void* p) {
  const auto* q = static_cast<const unsigned char*>(p);
  if (q < emulated::origin()) {
    emulated::fail("descriptor address below the 1024-byte aligned dynamic smem base",
                   static_cast<uint64_t>(emulated::origin() - q));
  }
  return static_cast<uint32_t>(q - emulated::origin());
}

inline uint64_t desc_k_major(const void* p) { return desc_bits(16, kGroupBytes) | ((smem_u32(p) >> 4) & 0x3fffu); }

inline uint64_t desc_mn_major(const void* p, uint32_t lbo_bytes) {
  return desc_bits(lbo_bytes, kGroupBytes) | ((smem_u32(p) >> 4) & 0x3fffu);
}

inline void fence() {}
inline void commit() {}
template <int N>
inline void wait() {}
template <int F>
inline void fence_operand(float (&)[F]) {}
inline void fence_proxy_async() {}
// The warpgroup's other threads have run their shares of its MMAs (on the
// GPU, wait<0>() already means so: wgmma.cuh).
inline void warpgroup_reads_done() { gaugewatch_emulation::warpgroup_barrier(); }
// The emulation has one barrier per warpgroup; the id only matters on the GPU.
inline void warpgroup_barrier(int /*id*/) { gaugewatch_emulation::warpgroup_barrier(); }
// A barrier of kCount threads, one per id, whoever reaches it (as bar.sync).
template <int kCount>
inline void named_barrier(int id) {
  gaugewatch_emulation::named_barrier(id, kCount);
}
// Arrival without waiting at the same barrier (bar.arrive).
template <int kCount>
inline void named_barrier_arrive(int id) {
  gaugewatch_emulation::named_barrier_arrive(id, kCount);
}
// Pingpong orders MMA issue between warpgroups for the tensor cores' sake; the
// emulation's MMAs run at the call, so there is nothing to order.
inline void pingpong_arrive(int /*id*/) {}
inline void pingpong_wait(int /*id*/) {}

// d (m64 x N) += A (m64 x k16) B (k16 x N); the shapes of wgmma.cuh.
template <bool kTransA, bool kTransB>
inline void mma_ss(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
  emulated::mma_ss(d, desc_a, kTransA, desc_b, kTransB);
}
template <bool kTransA, bool kTransB>
inline void mma_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  emulated::mma_ss(d, desc_a, kTransA, desc_b, kTransB);
}
template <bool kTransA, bool kTransB>
inline void mma_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  emulated::mma_ss(d, desc_a, kTransA, desc_b, kTransB);
}
template <bool kTransA, bool kTransB>
inline void mma_ss_first(float (&d)[4], uint64_t desc_a, uint64_t desc_b) {
  for (float& x : d) x = 0.0f;  // scale-d 0: the previous values are not read
  emulated::mma_ss(d, desc_a, kTransA, desc_b, kTransB);
}
template <bool kTransA, bool kTransB>
inline void mma_ss_first(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  for (float& x : d) x = 0.0f;  // scale-d 0: the previous values are not read
  emulated::mma_ss(d, desc_a, kTransA, desc_b, kTransB);
}
template <bool kTransA, bool kTransB>
inline void mma_ss_first(float (&d)[16], uint64_t desc_a, uint64_t desc_b) {
  for (float& x : d) x = 0.0f;  // scale-d 0: the previous values are not read
  emulated::mma_ss(d, desc_a, kTransA, desc_b, kTransB);
}
template <bool kTransA, bool kTransB>
inline void mma_ss_first(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  for (float& x : d) x = 0.0f;  // scale-d 0: the previous values are not read
  emulated::mma_ss(d, desc_a, kTransA, desc_b, kTransB);
}
template <bool kTransB>
inline void mma_rs(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b) {
  emulated::mma_rs(d, a, desc_b, kTransB);
}
template <bool kTransB>
inline void mma_rs_first(float (&d)[4], const uint32_t (&a)[4], uint64_t desc_b) {
  for (float& x : d) x = 0.0f;  // scale-d 0: the previous values are not read
  emulated::mma_rs(d, a, desc_b, kTransB);
}
template <bool kTransB>
inline void mma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
  emulated::mma_rs(d, a, desc_b, kTransB);
}
template <bool kTransA, bool kTransB>
inline void mma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  emulated::mma_ss(d, desc_a, kTransA, desc_b, kTransB);
}
template <bool kTransB>
inline void mma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  emulated::mma_rs(d, a, desc_b, kTransB);
}

}  // namespace gaugewatch::gpu::wgmma
