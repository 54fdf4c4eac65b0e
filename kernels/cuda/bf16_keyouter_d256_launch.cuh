#pragma once
// Launch of the head-dim-256 key-outer kernel (bf16_keyouter_d256_kernel.cuh)
// alone; what follows it: bf16_keyouter_d256.cu (bf16, pivot: the key-outer
// finish) and bf16_keyouter_d256_gproj.cu (gproj: lambda, the second pass,
// dQ). The caller (bf16_backward.cu) has run the delta pre-pass and zeroed
// the accumulators.

#include <cuda_runtime.h>

#include "kernels/cuda/bf16_keyouter_d256_kernel.cuh"

namespace gaugewatch::gpu::bf16 {

// dQacc's map for the tensor reductions of the head-dim-256 kernels, or
// cudaErrorNotSupported where it does not encode (no driver entry point: a
// failed call, not a silent fallback).
inline cudaError_t d256_dq_map(const Args& a, tma::TensorMap* map) {
  return keyouter256::encode_dq_map(a, map) ? cudaSuccess : cudaErrorNotSupported;
}

template <Projection P>
cudaError_t launch_keyouter_d256_kernel(const Args& a, const tma::TensorMap& dq_map, cudaStream_t stream) {
  constexpr int kSmem = static_cast<int>(keyouter256::Layout::kBytes);
  cudaError_t err =
      cudaFuncSetAttribute(keyouter256::keyouter_d256_kernel<P>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid = keyouter256::grid(a);
  if (grid.x > 0) {
    keyouter256::keyouter_d256_kernel<P><<<grid, keyouter256::kThreads, kSmem, stream>>>(dq_map, a);
    err = cudaGetLastError();
  }
  return err;
}

}  // namespace gaugewatch::gpu::bf16
