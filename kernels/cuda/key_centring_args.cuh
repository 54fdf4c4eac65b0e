#pragma once
// Launch arguments and launcher declarations of key centring (kernel bodies:
// key_centring_kernels.cuh; API and math: key_centring.h). Host-includable
// without the kernels, so key_centring.cu (host code, also compiled by the CPU
// emulation) does not define the kernels a second time.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/key_centring.h"

namespace gaugewatch::gpu::detail {

inline constexpr int kCentringThreads = 256;
inline constexpr int kCentringMaxHeadDim = 256;

struct CentringArgs {
  const void* q;
  const void* k;
  const float* lse;
  void* k_centred;
  float* lse_shifted;
  void* kbar;
  OperandStrides q_strides, k_strides, k_centred_strides;
  int64_t lse_strides[3];
  double* column_sums;     // (B * Hkv, splits, d) workspace: sum_j k_jc
  double* column_squares;  // (B * Hkv, splits, d) workspace: sum_j (k_jc - k_0c)^2
  int64_t hq, hkv, n, m, lse_len;
  int d;
  int splits;          // blocks per (b, hk)
  int64_t keys_per_split;
  int dtype;           // ElementType
  int policy;          // CentringPolicy
  double ratio;
  float scale;
};

// Launchers: key_centring_launch.cu on the GPU, the emulation glue on the CPU.
cudaError_t launch_centring_stats(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t stream);
cudaError_t launch_centring_apply(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t stream);

}  // namespace gaugewatch::gpu::detail
