#pragma once
// Shared-memory barriers with transaction counts (mbarrier, sm_90): what a TMA
// producer and its consumer warps synchronize on (tma.cuh, issue 13).
//
// Semantics (PTX ISA, "Parallel Synchronization and Communication
// Instructions: mbarrier": "Contents of the mbarrier object", "Phase of the
// mbarrier object", "Tracking asynchronous operations by the mbarrier object",
// "Phase Completion of the mbarrier object"):
//   An mbarrier is a 64-bit object in shared memory, 8-byte aligned. It holds
//   the current phase, a pending arrival count, the expected arrival count
//   (set by init) and a transaction count (tx-count, bytes).
//   init(count):       phase 0, pending = expected = count (1 .. 2^20 - 1),
//                      tx-count 0.
//   arrive:            pending -= 1 (release semantics at CTA scope: this
//                      thread's earlier writes are visible to whoever sees the
//                      phase complete).
//   arrive_expect_tx(b): tx-count += b, then arrive (one instruction).
//   complete_tx(b):    tx-count -= b; done by the hardware when an
//                      asynchronous copy naming the barrier (tma.cuh's
//                      load_2d) has written its b bytes. It may come before
//                      the matching expect_tx (tx-count briefly negative).
//   The current phase completes when pending == 0 and tx-count == 0 both
//   hold: the phase number advances by one (its parity flips), pending is
//   reset to the expected count, and every write the phase tracked (arrivals'
//   earlier writes, the copies' bytes) is visible to threads that observe the
//   completion.
//   try_wait.parity(p): true when the phase whose parity is p has completed,
//                      i.e. the current phase's parity is !p; it may suspend
//                      the thread for a while before answering false
//                      ("mbarrier.test_wait/mbarrier.try_wait"). Acquire
//                      semantics at CTA scope.
//   A consumer of stage s of a ring therefore waits with parity
//   (round & 1), round = number of times the ring went around; a producer
//   waiting for a free slot waits with ((round & 1) ^ 1), which passes at
//   once in round 0 (the phase "before" phase 0 counts as complete).
// Initialization: one thread calls init, then fence_init(), then the block
// synchronizes (__syncthreads) before any thread or copy uses the barrier
// ("fence.mbarrier_init": makes the init visible to the async proxy, which
// performs the copies' complete_tx). inval() before the memory is reused for
// anything else ("mbarrier.inval").

#include <cuda_runtime.h>

#include <cstdint>

#if defined(GAUGEWATCH_CUDA_EMULATION)
// CI without a GPU: the same functions on the CPU emulation's threads
// (tests/cuda/emulation/mbarrier_emulation.h).
#include "mbarrier_emulation.h"
#else
namespace gaugewatch::gpu::mbarrier {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Orders this thread's init()s before the async proxy's use of the barriers
// (then __syncthreads for the other threads).
__device__ __forceinline__ void fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

__device__ __forceinline__ void inval(uint64_t* bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile(
      "{\n.reg .b64 state;\n"
      "mbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_u32(bar))
      : "memory");
}

// tx-count += bytes, then one arrival: the producer's announcement of the
// bytes its copies into this stage will complete.
__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile(
      "{\n.reg .b64 state;\n"
      "mbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(smem_u32(bar)),
      "r"(bytes)
      : "memory");
}

// True when the phase of parity `parity` has completed (see above); may
// suspend for a hardware-chosen time first.
__device__ __forceinline__ bool try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Blocks until the phase of parity `parity` has completed.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  while (!try_wait(bar, parity)) {
  }
}

}  // namespace gaugewatch::gpu::mbarrier
#endif  // GAUGEWATCH_CUDA_EMULATION

namespace gaugewatch::gpu::mbarrier {

// A ring of kStages stages, full[s] completing after full_count arrivals and
// empty[s] after empty_count, and one barrier `once` of a single arrival (a
// load done once); fenced for the async proxy. One thread calls it, then the
// block synchronizes before any thread uses them.
template <int kStages>
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty, uint32_t full_count, uint32_t empty_count,
                                          uint64_t* once) {
  for (int s = 0; s < kStages; ++s) {
    init(&full[s], full_count);
    init(&empty[s], empty_count);
  }
  init(once, 1);
  fence_init();
}

}  // namespace gaugewatch::gpu::mbarrier
