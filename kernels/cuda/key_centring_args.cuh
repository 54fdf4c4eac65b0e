#pragma once
// Launch arguments and the launcher declaration of key centring (kernel body:
// key_centring_kernels.cuh; API and math: key_centring.h). Host-includable
// without the kernel, so key_centring.cu (host code, also compiled by the CPU
// emulation) does not define the kernel a second time.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/key_centring.h"

namespace gaugewatch::gpu::detail {

inline constexpr int kCentringThreads = 256;
inline constexpr int kCentringMaxHeadDim = 256;
inline constexpr int kCentringMaxCluster = 8;  // the portable cluster size
// Shared memory a block stages its keys in (and later its query tiles in):
// with the fixed regions below, one block of 214 KiB fits an sm_90 SM (227 KiB).
inline constexpr int64_t kCentringStageCap = 176 * 1024;
// Fixed regions after the stage: per-thread partial sums (256 threads x 8
// columns x {sum, square}, FP64), the block's column totals ({sum, square} x
// 256 columns, FP64, read by the cluster's other blocks), kbar (256 floats)
// and which 16-byte chunks of a row have a nonzero kbar (256 ints).
inline constexpr int64_t kCentringPartialsBytes = int64_t{kCentringThreads} * 8 * 2 * 8;
inline constexpr int64_t kCentringTotalsBytes = int64_t{kCentringMaxHeadDim} * 2 * 8;
inline constexpr int64_t kCentringKbarBytes = int64_t{kCentringMaxHeadDim} * 4;
inline constexpr int64_t kCentringFlagsBytes = int64_t{kCentringMaxHeadDim} * 4;
inline constexpr int64_t kCentringFixedBytes =
    kCentringPartialsBytes + kCentringTotalsBytes + kCentringKbarBytes + kCentringFlagsBytes;

struct CentringArgs {
  const void* q;
  const void* k;
  const float* lse;
  void* k_centred;
  float* lse_shifted;
  void* kbar;
  OperandStrides q_strides, k_strides, k_centred_strides;
  int64_t lse_strides[3];
  int64_t hq, hkv, n, m, lse_len, lse_out_len;
  int d;
  int cluster;          // blocks per (b, hk): the cluster's size, blockIdx.x its rank
  int64_t keys_per_block;
  int64_t resident_rows;  // keys of a block's share kept in shared memory (the rest is read again)
  int64_t stage_bytes;    // shared memory for the staged keys, then query tiles
  int esize;              // bytes per element: 2 or 4
  int vec;                // 1: 16-byte chunks; 0: one element per chunk
  int dtype;              // ElementType
  int policy;             // CentringPolicy
  double ratio;
  float scale;
};

// Dynamic shared memory of one block.
inline int64_t centring_smem_bytes(const CentringArgs& a) { return a.stage_bytes + kCentringFixedBytes; }

// Launcher: key_centring_launch.cu on the GPU, the emulation glue on the CPU.
// Grid (cluster, B * Hkv), clusters of (cluster, 1, 1).
cudaError_t launch_centring(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t stream);

}  // namespace gaugewatch::gpu::detail
