#pragma once
// Register reallocation between the warpgroups of a warp-specialized block
// (setmaxnreg, sm_90a): a producer warpgroup that only issues TMA copies
// gives registers back, consumer warpgroups that hold MMA accumulators take
// them (issue 13; FlashAttention-3's producer 24 / consumers 240 with three
// warpgroups at 168 registers each).
//
// Rules (PTX ISA, "setmaxnreg"): `.sync.aligned`: every thread of the
// warpgroup executes the same setmaxnreg (in convergence); the count is an
// immediate, a multiple of 8 in 24 .. 256. dec releases registers down to the
// count (the warpgroup must not need more afterwards), inc blocks until the
// block's pool has enough released registers and raises the limit to the
// count; a count below the current one for inc (or above it for dec) is
// undefined. The pool is what the block was launched with: ptxas sets each
// thread's count at entry from __launch_bounds__ (e.g. 384 threads, 1 block
// per SM: 168), so (dec + incs) per thread must not exceed warpgroups x that
// count. On the CPU emulation both are no-ops.

#include <cuda_runtime.h>

namespace gaugewatch::gpu::regs {

template <int kCount>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kCount % 8 == 0 && kCount >= 24 && kCount <= 256, "setmaxnreg: multiple of 8 in 24 .. 256");
#if !defined(GAUGEWATCH_CUDA_EMULATION)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kCount));
#endif
}

template <int kCount>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kCount % 8 == 0 && kCount >= 24 && kCount <= 256, "setmaxnreg: multiple of 8 in 24 .. 256");
#if !defined(GAUGEWATCH_CUDA_EMULATION)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kCount));
#endif
}

}  // namespace gaugewatch::gpu::regs
