#pragma once
// Launch template of the fused BF16 backward for one (head dim, projection):
// the query-outer dq kernel, then the key-outer dkdv kernel, on one stream
// (the second reads the first's per-row lambda / rho / j*). Instantiated once
// per pair in bf16_backward_d{64,128}_{none,gproj,pivot}.cu so that each
// translation unit stays small (CI compiles on 2 cores).

#include <cuda_runtime.h>

#include "kernels/cuda/bf16_backward_hopper.cuh"
#include "kernels/cuda/bf16_backward_kernel.cuh"

namespace gaugewatch::gpu::bf16 {

// Runs the pair with BQ blocks per SM for the dq kernel and BKV for the dkdv
// kernel (Occupancy, DefaultBlocks).
template <int D, Projection P, int BQ, int BKV>
cudaError_t launch_blocks(const Args& a, cudaStream_t stream) {
  constexpr int kDqSmem = static_cast<int>(DqSmem<D>::kBytes);
  constexpr int kKvSmem = static_cast<int>(DkdvSmem<D, P, Occupancy<D, BKV>::kDoubleBufferQ>::kBytes);
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

// The Hopper pair (bf16_backward_hopper.cuh): two warpgroups per block.
template <int D, Projection P>
cudaError_t launch_hopper(const Args& a, cudaStream_t stream) {
  constexpr int kDqSmem = static_cast<int>(hopper::DqLayout<D>::kBytes);
  constexpr int kKvSmem = static_cast<int>(hopper::KvLayout<D, P>::kBytes);
  constexpr int kBlocks = hopper::kBlocksPerSm;
  static_assert(kBlocks * (kDqSmem + 1024) <= 228 * 1024, "dq kernel: blocks do not fit one SM's shared memory");
  static_assert(kKvSmem + 1024 <= 228 * 1024, "dkdv kernel: a block does not fit one SM's shared memory");
  cudaError_t err =
      cudaFuncSetAttribute(hopper::dq_kernel<D, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDqSmem);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(hopper::dkdv_kernel<D, P>, cudaFuncAttributeMaxDynamicSharedMemorySize, kKvSmem);
  if (err != cudaSuccess) return err;
  const int64_t bhq = static_cast<int64_t>(a.batch) * a.hq, bhk = static_cast<int64_t>(a.batch) * a.hkv;
  const dim3 dq_grid(static_cast<unsigned>((a.n + hopper::kDqRows - 1) / hopper::kDqRows), static_cast<unsigned>(bhq));
  if (dq_grid.x > 0 && dq_grid.y > 0) {
    hopper::dq_kernel<D, P><<<dq_grid, hopper::kThreads, kDqSmem, stream>>>(a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const dim3 kv_grid(static_cast<unsigned>((a.m + hopper::kKvKeys - 1) / hopper::kKvKeys),
                     static_cast<unsigned>(bhk));
  if (kv_grid.x > 0 && kv_grid.y > 0) {
    hopper::dkdv_kernel<D, P><<<kv_grid, hopper::kThreads, kKvSmem, stream>>>(a);
    err = cudaGetLastError();
  }
  return err;
}

// The Hopper pair, or the mma.sync pair at its default blocks per SM
// (DefaultBlocks) under GAUGEWATCH_BF16_KERNEL=mma_sync.
template <int D, Projection P>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  if (use_mma_sync_pair()) {
    return launch_blocks<D, P, DefaultBlocks<D, P>::kDq, DefaultBlocks<D, P>::kDkdv>(a, stream);
  }
  return launch_hopper<D, P>(a, stream);
}

}  // namespace gaugewatch::gpu::bf16
