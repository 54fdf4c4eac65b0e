#pragma once
// Launch template of the fused BF16 backward for one (head dim, projection):
// the query-outer dq kernel, then the key-outer dkdv kernel, on one stream
// (the second reads the first's per-row lambda / rho / j*). Instantiated once
// per pair in bf16_backward_d{64,128}_{none,gproj,pivot}.cu so that each
// translation unit stays small (CI compiles on 2 cores).

#include <cuda_runtime.h>

#include <cstdlib>

#include "kernels/cuda/bf16_backward_kernel.cuh"

namespace gaugewatch::gpu::bf16 {

template <int D, Projection P, int B>
cudaError_t launch_blocks(const Args& a, cudaStream_t stream) {
  constexpr int kDqSmem = static_cast<int>(DqSmem<D>::kBytes);
  constexpr int kKvSmem = static_cast<int>(DkdvSmem<D, P, Occupancy<D, B>::kDoubleBufferQ>::kBytes);
  static_assert(kDqSmem <= 227 * 1024 && kKvSmem <= 227 * 1024, "tile does not fit one SM's shared memory");
  cudaError_t err = cudaFuncSetAttribute(dq_kernel<D, P, B>, cudaFuncAttributeMaxDynamicSharedMemorySize, kDqSmem);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(dkdv_kernel<D, P, B>, cudaFuncAttributeMaxDynamicSharedMemorySize, kKvSmem);
  if (err != cudaSuccess) return err;
  const int64_t bhq = static_cast<int64_t>(a.batch) * a.hq, bhk = static_cast<int64_t>(a.batch) * a.hkv;
  const dim3 dq_grid(static_cast<unsigned>((a.n + kBr - 1) / kBr), static_cast<unsigned>(bhq));
  if (dq_grid.x > 0 && dq_grid.y > 0) {
    dq_kernel<D, P, B><<<dq_grid, kThreads, kDqSmem, stream>>>(a);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const dim3 kv_grid(static_cast<unsigned>((a.m + kBc - 1) / kBc), static_cast<unsigned>(bhk));
  if (kv_grid.x > 0 && kv_grid.y > 0) {
    dkdv_kernel<D, P, B><<<kv_grid, kThreads, kKvSmem, stream>>>(a);
    err = cudaGetLastError();
  }
  return err;
}

// D = 64 runs two blocks per SM; gproj at D = 128 one (see Occupancy). bf16
// and pivot at D = 128: the fully unrolled one-block variant (the one measured
// on the H200, bench/results/bench_bf16_backward-h200-*) unless
// GAUGEWATCH_BF16_BLOCKS_PER_SM=2 selects the two-block variant, which is
// verified (bitwise equal, sanitizer-clean) but not yet timed: the benchmark
// times both in one process, and the default follows that measurement.
template <int D, Projection P>
cudaError_t launch(const Args& a, cudaStream_t stream) {
  if constexpr (D == 64) {
    return launch_blocks<D, P, 2>(a, stream);
  } else if constexpr (P == Projection::kGproj) {
    return launch_blocks<D, P, 1>(a, stream);
  } else {
    const char* env = std::getenv("GAUGEWATCH_BF16_BLOCKS_PER_SM");
    if (env != nullptr && env[0] == '2' && env[1] == '\0') return launch_blocks<D, P, 2>(a, stream);
    return launch_blocks<D, P, 1>(a, stream);
  }
}

}  // namespace gaugewatch::gpu::bf16
