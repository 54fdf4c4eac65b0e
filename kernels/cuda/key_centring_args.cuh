#pragma once
// Launch arguments and the launcher declaration of key centring (kernel body:
// key_centring_kernels.cuh; API and math: key_centring.h). Host-includable
// without the kernel, so key_centring.cu (host code, also compiled by the CPU
// emulation) does not define the kernel a second time.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/key_centring.h"

namespace gaugewatch::gpu::detail {

// One block of 512 threads (16 warps) per SM: the registers (at most 128 a
// thread) and the shared memory below are sized for that.
inline constexpr int kCentringThreads = 512;
inline constexpr int kCentringMaxHeadDim = 256;
inline constexpr int kCentringMaxCluster = 8;  // the portable cluster size
// Rows of keys in flight per block while the block sums earlier ones: batches
// of about kCentringBatchBytes, kCentringDepth - 1 of them loading ahead.
inline constexpr int64_t kCentringBatchBytes = 16 * 1024;
inline constexpr int kCentringDepth = 4;
// Shared memory a block stages its keys in (and later its query tiles in).
inline constexpr int64_t kCentringStageBytes = 200 * 1024;
// Fixed regions after the stage: per-thread partial sums (512 threads x 2
// columns x {sum, square}, FP64), the block's column totals ({sum, square} x
// 256 columns, FP64, read by the cluster's other blocks), kbar as floats and
// as doubles times 2^896 (256 each; see scaled_double) and which chunks of a
// row have a nonzero kbar (256 ints). Stage and fixed regions: 224 KiB, one block per sm_90 SM (227 KiB).
inline constexpr int64_t kCentringPartialsBytes = int64_t{kCentringThreads} * 2 * 2 * 8;
inline constexpr int64_t kCentringTotalsBytes = int64_t{kCentringMaxHeadDim} * 2 * 8;
inline constexpr int64_t kCentringKbarBytes = int64_t{kCentringMaxHeadDim} * 4;
inline constexpr int64_t kCentringKbarScaledBytes = int64_t{kCentringMaxHeadDim} * 8;
inline constexpr int64_t kCentringFlagsBytes = int64_t{kCentringMaxHeadDim} * 4;
inline constexpr int64_t kCentringFixedBytes = kCentringPartialsBytes + kCentringTotalsBytes + kCentringKbarBytes +
                                               kCentringKbarScaledBytes + kCentringFlagsBytes;
inline constexpr int64_t kCentringSmemBytes = kCentringStageBytes + kCentringFixedBytes;

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
  int cluster;             // blocks per (b, hk): the cluster's size, blockIdx.x its rank
  int64_t keys_per_block;  // P: a block's share of its (b, hk)'s keys
  int64_t resident_rows;   // keys of the share kept in the stage (the rest pass through a ring and are read again)
  int64_t batch_rows;      // keys per load batch (resident_rows is a multiple of it when some are not kept)
  int64_t query_tile_rows;  // lse rows per query tile (kCentringThreads / query_parts)
  int query_parts;          // threads per query row (a power of two): each adds every query_parts-th chunk
  int64_t query_stride;     // bytes between query rows in a tile (the row padded against bank conflicts)
  int dtype;                // ElementType (the kernel instantiation)
  int vec;                  // 1: 16-byte chunks and 4-byte words; 0: one element at a time
  int policy;               // CentringPolicy
  double ratio;
  float scale;
};

// Launcher: key_centring_launch.cu on the GPU, the emulation glue on the CPU.
// Grid (cluster, B * Hkv), clusters of (cluster, 1, 1), kCentringSmemBytes of
// dynamic shared memory a block.
cudaError_t launch_centring(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t stream);

}  // namespace gaugewatch::gpu::detail
