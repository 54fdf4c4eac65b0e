// GPU launches of the metric reduction kernels (bodies and math in
// metrics_kernels.cuh, API in metrics.h). The CPU emulation defines the same
// launchers over its block runner (tests/cuda/metrics_test.cpp), so this file
// holds nothing but grid shapes and <<<>>>.
// Build: target gaugewatch_cuda (sm_90a). Run: build/bin/gaugewatch_cuda_metrics_tests.

#include "kernels/cuda/metrics_kernels.cuh"

namespace gaugewatch::gpu::detail {

namespace {

unsigned blocks_for(int64_t items) { return static_cast<unsigned>((items + kMetricsThreads - 1) / kMetricsThreads); }

}  // namespace

cudaError_t launch_key_centre(const CentreArgs& args, int64_t heads, cudaStream_t stream) {
  if (heads == 0) return cudaSuccess;
  key_centre_kernel<<<static_cast<unsigned>(heads), kMetricsThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_translate(const TranslateArgs& args, cudaStream_t stream) {
  if (args.kv_total > 0) {
    translate_keys_kernel<<<static_cast<unsigned>(args.k_blocks), kMetricsThreads, 0, stream>>>(args);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (args.rows > 0) {
    translate_lse_kernel<<<blocks_for(args.rows), kMetricsThreads, 0, stream>>>(args);
    return cudaGetLastError();
  }
  return cudaSuccess;
}

cudaError_t launch_geometry(const GeometryArgs& args, int64_t slices, cudaStream_t stream) {
  const size_t smem = geometry_smem_bytes(args.d);
  cudaError_t err =
      cudaFuncSetAttribute(geometry_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>((args.n + kGeoRows - 1) / kGeoRows), static_cast<unsigned>(slices));
  if (grid.x == 0 || grid.y == 0) return cudaSuccess;
  geometry_kernel<<<grid, kMetricsThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_row_finish(const GeometryArgs& args, int64_t rows, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  row_finish_kernel<<<blocks_for(rows), kMetricsThreads, 0, stream>>>(args, rows);
  return cudaGetLastError();
}

cudaError_t launch_row_stats(const RowStatsArgs& args, cudaStream_t stream) {
  row_stats_kernel<<<kRowBlocks, kMetricsThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_norms(const NormArgs& args, cudaStream_t stream) {
  norms_kernel<<<dim3(kNormBlocks, kNormJobs), kMetricsThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_medians(const MedianArgs& args, cudaStream_t stream) {
  medians_kernel<<<kMedians, kMetricsThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

cudaError_t launch_finish(const FinishArgs& args, cudaStream_t stream) {
  finish_kernel<<<1, 32, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace gaugewatch::gpu::detail
