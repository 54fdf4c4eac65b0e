#pragma once
// Bulk asynchronous reduction from shared to global memory (sm_90,
// cp.reduce.async.bulk): dst[i] += src[i] for `bytes` / 4 FP32 values, done by
// the copy engine in the order it chooses (the adds land in L2 like atomics).
// Used by the key-outer kernel without warp specialization
// (bf16_keyouter_kernel.cuh, keyouter_kernel) to add a staged dQ tile row to
// the FP32 accumulator with one instruction instead of a register atomic per
// element pair, and the bulk L2 prefetch. The group operations (commit,
// wait_read, wait_all) also complete the TMA tensor reductions of tma.cuh,
// which are bulk-group operations too.
//
// Rules (PTX ISA, "cp.reduce.async.bulk"): src and dst 16-byte aligned,
// bytes a multiple of 16; the shared source written by ordinary stores must
// be made visible to the async proxy first (fence.proxy.async.shared::cta by
// the writers, then a barrier); the issuing thread commits its operations
// into a bulk group and waits for the group's reads of shared memory
// (wait_read) before the source is overwritten, and for its completion
// (wait_all) before the block exits.

#include <cuda_runtime.h>

#include <cstdint>

#if defined(GAUGEWATCH_CUDA_EMULATION)
// CI without a GPU: the reduction done at the call (tests/cuda/emulation).
#include "bulk_reduce_emulation.h"
#else
namespace gaugewatch::gpu::bulk {

__device__ __forceinline__ void reduce_add_f32(float* dst, const float* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(static_cast<uint32_t>(__cvta_generic_to_shared(src))), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's committed groups have read their shared sources.
__device__ __forceinline__ void wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// This thread's committed groups are complete.
__device__ __forceinline__ void wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// A hint: bring `bytes` of global memory from src into L2
// (cp.async.bulk.prefetch.L2; src 16-byte aligned, bytes a multiple of 16).
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}

}  // namespace gaugewatch::gpu::bulk
#endif
