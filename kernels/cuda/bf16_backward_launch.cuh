#pragma once
// Launch template of the fused BF16 backward for one (head dim, projection):
// the query-outer dq kernel, then the key-outer dkdv kernel, on one stream
// (the second reads the first's per-row lambda / rho / j*), of the kernel pair
// the parameters chose. Instantiated once per (head dim, projection) in
// bf16_backward_d{64,128}_{none,gproj,pivot}.cu so that each translation unit
// stays small (CI compiles on 2 cores).

#include <cuda_runtime.h>

#include "kernels/cuda/baseline/bf16_mma_sync_launch.cuh"
#include "kernels/cuda/bf16_backward_hopper.cuh"

namespace gaugewatch::gpu::bf16 {

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
  const dim3 dq_grid = hopper::query_tile_grid(a);
  if (dq_grid.x > 0) {
    hopper::dq_kernel<D, P><<<dq_grid, hopper::kThreads, kDqSmem, stream>>>(a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const dim3 kv_grid = hopper::key_block_grid(a);
  if (kv_grid.x > 0) {
    hopper::dkdv_kernel<D, P><<<kv_grid, hopper::kThreads, kKvSmem, stream>>>(a);
    err = cudaGetLastError();
  }
  return err;
}

// The kernel pair `pair` names; at head dim 256 the mma.sync pair, the only
// one whose tiles fit there (bf16_backward.h).
template <int D, Projection P>
cudaError_t launch(const Args& a, Bf16KernelPair pair, cudaStream_t stream) {
  if constexpr (D == 256) {
    return mma_sync::launch<D, P>(a, stream);
  } else {
    if (pair == Bf16KernelPair::kMmaSyncBaseline) return mma_sync::launch<D, P>(a, stream);
    return launch_hopper<D, P>(a, stream);
  }
}

}  // namespace gaugewatch::gpu::bf16
