#pragma once
// Launch arguments and the launcher declaration of key centring (kernel
// bodies: key_centring_kernels.cuh; API and math: key_centring.h).
// Host-includable without the kernels, so key_centring.cu (host code, also
// compiled by the CPU emulation) does not define them a second time.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/key_centring.h"

namespace gaugewatch::gpu::detail {

inline constexpr int kCentringMaxHeadDim = 256;
inline constexpr int kCentringMaxCluster = 8;  // the portable cluster size

// The summation order. The FP64 column sums are added in a fixed order that
// depends on the shape only (so kbar is bit-identical run to run and device
// to device): a (b, hk)'s keys split into `cluster` shares of keys_per_block
// keys (cluster_of in key_centring.cu, a function of the shape and of
// kCentringOrderShareBytes); a share's keys taken in batches of batch_rows =
// kCentringOrderBatchBytes / row bytes; within a batch, chain (phase p, unit
// u) adds unit u (a 4-byte word: 1 or 2 columns; one element on the
// one-element path) of batch rows p, p + S, p + 2 S, ... (S =
// kCentringOrderThreads / units per row), batch after batch; a share's
// column total adds its chains in phase order, the column's sum the shares'
// totals in share order (each from 0.0). q . kbar is added by
// query_parts threads a row (query_parts_of in key_centring.cu), thread
// `part` taking chunks part, part + parts, ... in two chains (even and odd
// elements), the parts then meeting by xor shuffles. These constants fix
// that order (and with it kbar's rounding, which the tests pin bit for bit);
// they need not match the kernels' launch shapes.
inline constexpr int kCentringOrderThreads = 512;
inline constexpr int64_t kCentringOrderShareBytes = 200 * 1024;
inline constexpr int64_t kCentringOrderBatchBytes = 16 * 1024;

// Kernel 1 (sums): one block of kCentringOrderThreads threads per share (a
// thread per chain), clusters of `cluster` blocks per (b, hk); two blocks per
// SM (at most 64 registers a thread). Shared memory: per-thread partial sums
// (512 threads x 2 columns x {sum, square}, FP64) and the block's column
// totals ({sum, square} x 256 columns, FP64, read by the cluster's other
// blocks).
inline constexpr int kCentringSumThreads = kCentringOrderThreads;
inline constexpr int64_t kCentringPartialsBytes = int64_t{kCentringSumThreads} * 2 * 2 * 8;
inline constexpr int64_t kCentringTotalsBytes = int64_t{kCentringMaxHeadDim} * 2 * 8;
inline constexpr int64_t kCentringSumSmemBytes = kCentringPartialsBytes + kCentringTotalsBytes;

// Kernel 2 (apply): blocks of 256 threads, `apply_blocks` per (b, hk), about
// kCentringApplyBlocksTarget in all (four resident per SM, four rounds on a
// 132-SM GPU, so the last round's tail is short) but at least
// kCentringApplyMinKeys keys a block. Shared
// memory: kbar as floats and as doubles times 2^896 (256 each; see
// scaled_double) and which 16-byte chunks of a row have a nonzero kbar (256
// ints).
inline constexpr int kCentringApplyThreads = 256;
inline constexpr int64_t kCentringApplyBlocksTarget = 16 * 132;
inline constexpr int64_t kCentringApplyMinKeys = 64;
inline constexpr int64_t kCentringKbarBytes = int64_t{kCentringMaxHeadDim} * 4;
inline constexpr int64_t kCentringKbarScaledBytes = int64_t{kCentringMaxHeadDim} * 8;
inline constexpr int64_t kCentringFlagsBytes = int64_t{kCentringMaxHeadDim} * 4;
inline constexpr int64_t kCentringApplySmemBytes = kCentringKbarScaledBytes + kCentringKbarBytes + kCentringFlagsBytes;

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
  int64_t pairs;           // B * Hkv
  int d;
  int sums;                // 1: kernel 1 runs and writes kbar (policy not never, M > 0); 0: kbar is 0
  int cluster;             // kernel 1: blocks (shares) per (b, hk), the cluster's size, blockIdx.x its rank
  int64_t keys_per_block;  // kernel 1: a share's keys
  int64_t batch_rows;      // kernel 1: keys per batch of the summation order
  int apply_blocks;        // kernel 2: blocks per (b, hk), blockIdx.x its index
  int64_t apply_keys;      // kernel 2: keys a block centres
  int64_t apply_lse_rows;  // kernel 2: (query head, lse row) pairs a block shifts
  int query_parts;         // threads per query row (a power of two, at most 32)
  int dtype;               // ElementType (the kernel instantiation)
  int vec;                 // 1: 16-byte chunks and 4-byte words; 0: one element at a time
  int policy;              // CentringPolicy
  double ratio;
  float scale;
};

// Launcher: key_centring_launch.cu on the GPU, the emulation glue on the CPU.
// Kernel 1 (when args.sums): grid (cluster, B * Hkv), clusters of (cluster,
// 1, 1), kCentringSumSmemBytes of dynamic shared memory a block; then, on
// the same stream, kernel 2: grid (apply_blocks, B * Hkv),
// kCentringApplySmemBytes.
cudaError_t launch_centring(const CentringArgs& args, int64_t kv_heads_total, cudaStream_t stream);

}  // namespace gaugewatch::gpu::detail
