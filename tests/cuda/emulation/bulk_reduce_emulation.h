#pragma once
// kernels/cuda/bulk_reduce.cuh on the CPU emulation: the reduction runs at the
// call, element by element through the emulated atomicAdd (cuda_runtime.h), so
// concurrent reductions into one row add up as on the GPU; commit and the
// waits have nothing left to wait for. A source or destination that breaks
// the instruction's alignment rules aborts with a message.

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "cuda_runtime.h"

namespace gaugewatch::gpu::bulk {

inline void reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || reinterpret_cast<uintptr_t>(src) % 16 != 0 || bytes % 16 != 0) {
    std::fprintf(stderr, "bulk reduce emulation: addresses and size must be multiples of 16 bytes\n");
    std::abort();
  }
  for (uint32_t i = 0; i < bytes / 4; ++i) atomicAdd(dst + i, src[i]);
}
// A hint with nothing to do here; its operands' rules are checked.
inline void prefetch_l2(const void* src, uint32_t bytes) {
  if (reinterpret_cast<uintptr_t>(src) % 16 != 0 || bytes % 16 != 0) {
    std::fprintf(stderr, "bulk prefetch emulation: address and size must be multiples of 16 bytes\n");
    std::abort();
  }
}
inline void commit() {}
inline void wait_read() {}
inline void wait_all() {}

}  // namespace gaugewatch::gpu::bulk
