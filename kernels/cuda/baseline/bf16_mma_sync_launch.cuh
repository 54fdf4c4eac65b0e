#pragma once
// Launch template of the mma.sync baseline pair (baseline/bf16_mma_sync_kernel.cuh)
// for one (head dim, projection): the query-outer dq kernel, then the
// key-outer dkdv kernel, on one stream.

#include <cuda_runtime.h>

#include "kernels/cuda/baseline/bf16_mma_sync_kernel.cuh"

namespace gaugewatch::gpu::bf16::mma_sync {

// Runs the pair with BQ blocks per SM for the dq kernel and BKV for the dkdv
// kernel (Occupancy, DefaultBlocks).
template <int D, Projection P, int BQ = DefaultBlocks<D, P>::kDq, int BKV = DefaultBlocks<D, P>::kDkdv>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  constexpr int kDqSmem = static_cast<int>(DqSmem<D>::kBytes);
  constexpr int kKvSmem = static_cast<int>(DkdvSmem<D, P, kDoubleBufferQ<D, P, BKV>>::kBytes);
  // 228 KiB per SM (sm_90), of which the runtime reserves 1 KiB per block.
  static_assert(BQ * (kDqSmem + 1024) <= 228 * 1024, "dq kernel: BQ blocks do not fit one SM's shared memory");
  static_assert(BKV * (kKvSmem + 1024) <= 228 * 1024, "dkdv kernel: BKV blocks do not fit one SM's shared memory");
  cudaError_t err = cudaFuncSetAttribute(dq_kernel<D, P, BQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDqSmem);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(dkdv_kernel<D, P, BKV>, cudaFuncAttributeMaxDynamicSharedMemorySize, kKvSmem);
  if (err != cudaSuccess) return err;
  const int64_t bhq = static_cast<int64_t>(a.batch) * a.hq, bhk = static_cast<int64_t>(a.batch) * a.hkv;
  const dim3 dq_grid(static_cast<unsigned>((a.n + kBr - 1) / kBr), static_cast<unsigned>(bhq));
  if (dq_grid.x > 0 && dq_grid.y > 0) {
    dq_kernel<D, P, BQ><<<dq_grid, kThreads, kDqSmem, stream>>>(a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const dim3 kv_grid(static_cast<unsigned>((a.m + kBc - 1) / kBc), static_cast<unsigned>(bhk));
  if (kv_grid.x > 0 && kv_grid.y > 0) {
    dkdv_kernel<D, P, BKV><<<kv_grid, kThreads, kKvSmem, stream>>>(a);
    err = cudaGetLastError();
  }
  return err;
}

}  // namespace gaugewatch::gpu::bf16::mma_sync
