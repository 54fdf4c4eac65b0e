#pragma once
// Launch template of the fused FP32 attention backward for one head dim:
// the row kernel (row statistics; dQ in deterministic mode), then the dK/dV
// kernel (dQ atomics otherwise). Instantiated once per head dim in
// fp32_backward_d{64,128,256}.cu so each translation unit stays small.
// Build: target gaugewatch_cuda (sm_90a). Run: build/bin/gaugewatch_cuda_tests.

#include <cuda_runtime.h>

#include "kernels/cuda/fp32_backward_kernel.cuh"

namespace gaugewatch::gpu::detail {

template <int D>
cudaError_t launch_fp32_backward(const Args& args, cudaStream_t stream) {
  using Cfg = typename TileConfig<D>::type;
  static_assert(Cfg::kSmemBytes <= kMaxSmemPerBlock, "tile does not fit one SM's shared memory");
  constexpr int kSmem = static_cast<int>(Cfg::kSmemBytes);
  cudaError_t err = cudaFuncSetAttribute(fp32_backward_rows_kernel<Cfg>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(fp32_backward_dkdv_kernel<Cfg>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmem);
  if (err != cudaSuccess) return err;

  const dim3 row_grid(static_cast<unsigned>((args.num_rows + Cfg::kBr - 1) / Cfg::kBr),
                      static_cast<unsigned>(args.num_slices));
  if (row_grid.x > 0 && row_grid.y > 0) {
    fp32_backward_rows_kernel<Cfg><<<row_grid, kThreads, kSmem, stream>>>(args);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const dim3 key_grid(static_cast<unsigned>((args.m + Cfg::kBc - 1) / Cfg::kBc),
                      static_cast<unsigned>(args.batch * args.hkv));
  if (key_grid.x > 0 && key_grid.y > 0) {
    fp32_backward_dkdv_kernel<Cfg><<<key_grid, kThreads, kSmem, stream>>>(args);
    err = cudaGetLastError();
  }
  return err;
}

template <int D>
cudaError_t launch_mean_key(const float* k, float* mu, int64_t heads, int64_t m, cudaStream_t stream) {
  if (heads == 0) return cudaSuccess;
  mean_key_kernel<D><<<static_cast<unsigned>(heads), kThreads, 0, stream>>>(k, mu, m);
  return cudaGetLastError();
}

}  // namespace gaugewatch::gpu::detail
