#pragma once
// Launch arguments, constants and launcher declarations of the metric
// reductions (kernel bodies: metrics_kernels.cuh; API and math: metrics.h).
// Host-includable without the kernels, so metrics.cu (host code, also compiled
// by the CPU emulation) does not define the kernels a second time.

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/metrics.h"

namespace gaugewatch::gpu::detail {

inline constexpr int kMetricsThreads = 256;
inline constexpr int kGeoRows = 16;                               // query rows per geometry block
inline constexpr int kGeoLanes = kMetricsThreads / kGeoRows;      // threads per row
inline constexpr int kGeoKeys = 64;                               // keys per shared-memory tile
inline constexpr int kGeoKeysPerLane = kGeoKeys / kGeoLanes;
inline constexpr int kMaxHeadDim = 256;
inline constexpr int kMaxColsPerLane = kMaxHeadDim / kGeoLanes;
// Fixed grid sizes: the partition of every sum, hence its rounding, never
// depends on the device.
inline constexpr int kRowBlocks = 32;
inline constexpr int kNormBlocks = 32;
inline constexpr int kMedians = 3;  // offset, spread, ratio
// Bits of a row value that is left out; sorts after every non-negative double.
inline constexpr uint64_t kExcluded = ~0ull;

// Norm jobs, in the order finish_kernel reads them.
enum NormJobId : int {
  kJobLiveDq, kJobLiveDk, kJobLiveDv, kJobGprojDq, kJobGprojDk, kJobGprojDv,
  kJobLiveGauge, kJobGprojGauge, kJobKeySquares, kNormJobs,
};
// Row partials, in the order finish_kernel reads them.
enum RowStatId : int {
  kStatVisible, kStatMassSum, kStatMassMax, kStatNormSum, kStatNormMax,
  kStatOffsetMax, kStatRatioMax, kStatSharp, kStatLogitMax, kStatSpreadRows, kRowStats,
};
// Bit v set: row partial v is a sum (else a maximum).
inline constexpr unsigned kStatSumMask =
    (1u << kStatVisible) | (1u << kStatMassSum) | (1u << kStatNormSum) | (1u << kStatSharp) |
    (1u << kStatSpreadRows);

struct NormJob {
  const void* a;
  const void* b;  // null: sum a^2 only
  int64_t count;
  int type_a;     // ElementType
  int type_b;
};

struct CentreArgs {
  const float* k;  // (heads, M, d)
  float* centre;   // (heads, d)
  int64_t m;
  int d;
};

struct TranslateArgs {
  const float* q;
  const float* k;
  const float* centre;
  const float* lse;
  uint16_t* k_out;
  float* lse_out;
  int64_t kv_total;  // B * Hkv * M * d
  int64_t rows;      // B * Hq * N
  int64_t hq, hkv, n, m;
  int d;
  double scale;
  int64_t k_blocks;  // grid of translate_keys_kernel
};

struct GeometryArgs {
  const int32_t* cu_q;  // masking as kernels/cuda/masking.cuh
  const int32_t* cu_k;
  int num_segments;
  int causal;  // CausalMode
  AttentionMask mask;
  const float* q;
  const float* k;
  const float* centre;
  double* offset;
  double* spread;
  double* ratio;
  double* p_max;
  double* logit_max;
  int64_t hq, hkv, n, m;
  int d;
  float scale_f;
  double scale;
};

struct RowStatsArgs {
  const float* row_mass;
  const float* abs_row_mass;
  const double* offset;
  const double* ratio;
  const double* p_max;
  const double* logit_max;
  int64_t rows;
  double* partials;  // (kRowBlocks, kRowStats)
};

struct NormArgs {
  NormJob jobs[kNormJobs];
  double* partials;  // (kNormJobs, kNormBlocks, 2)
};

struct MedianArgs {
  const double* values[kMedians];
  int64_t rows;
  double* medians;  // (kMedians)
};

struct FinishArgs {
  const double* row_partials;
  const double* norm_partials;
  const double* medians;
  int64_t key_count;  // B * Hkv * M
  double* out;        // (kMetricCount)
};

size_t geometry_smem_bytes(int d);

// Launchers: metrics_launch.cu on the GPU, the emulation glue on the CPU.
cudaError_t launch_key_centre(const CentreArgs& args, int64_t heads, cudaStream_t stream);
cudaError_t launch_translate(const TranslateArgs& args, cudaStream_t stream);
cudaError_t launch_geometry(const GeometryArgs& args, int64_t slices, cudaStream_t stream);
cudaError_t launch_row_finish(const GeometryArgs& args, int64_t rows, cudaStream_t stream);
cudaError_t launch_row_stats(const RowStatsArgs& args, cudaStream_t stream);
cudaError_t launch_norms(const NormArgs& args, cudaStream_t stream);
cudaError_t launch_medians(const MedianArgs& args, cudaStream_t stream);
cudaError_t launch_finish(const FinishArgs& args, cudaStream_t stream);

}  // namespace gaugewatch::gpu::detail
