#pragma once
// The docs/numerics.md metrics of one sampled attention call, reduced on the GPU
// (sm_90). Plain C++ API over raw device pointers (no torch), so tests and the
// torch op call the same launcher. kernels/reference/metrics.cpp is the CPU
// truth; the values come out in the order of reference::MetricId
// (kernels/reference/metric_catalogue.h).
//
// Math (one batch element b, query head h, key/value head hk = h / (Hq / Hkv);
// alpha = scale; "visible" keys as kernels/cuda/fp32_backward.h masks them):
//   c        = bf16(mean_j k_j), over all M keys of (b, hk)   (the centre)
//   k'_j     = k_j - c        exact in FP32 for BF16 keys near their mean
//   s'_ij    = alpha q_i.k'_j  (FP32)     softmax is blind to the row
//                                          constant alpha q_i.c, so
//   p_ij     = exp(s'_ij - m_i) / l_i     is the exact softmax, without the
//                                          |s| ~ 3e4 logits of offset keys
//   mu_k,i   = c + sum_j p_ij k'_j,        offset_i = ||mu_k,i||  (FP64 norm)
//   sigma_k,i = sqrt(sum_j p_ij ||k'_j - mu'_i||^2)  a second pass over the
//              keys once mu'_i is known: every term is >= 0, nothing cancels
//   p_max,i  = max_j p_ij = 1 / l_i,   logit_i = max_j |s'_ij + alpha q_i.c|
//   row mass: |rho_i| and |rho_i| / sum_j |t_ij| from the BF16 kernel's row
//             diagnostics (Bf16RowDiagnostics, kernels/cuda/bf16_backward.h)
//   medians:  exact order statistics (the mean of the two middle values for
//             an even count), by a radix select on the FP64 bit patterns
//   discrepancy ||x - r|| / ||r|| (FP64 sums; ||x|| when ||r|| = 0), gauge
//   violation ||dQ(K + b) - dQ(K)|| / ||dQ(K)||, key RMS over all of K.
// attn_mask (ProblemShape::mask) joins the logits as a bias (a False entry or
// -inf masks the pair out; the logit maximum is over the pairs that take part).
// Rows with no visible key are left out of every row statistic; a row whose
// spread is 0 (it sees one key) is left out of the ratio statistics.
//
// Determinism: no atomics; every sum has a fixed owner and a fixed order
// (fixed grid sizes, fixed tree), so results are bit-identical run to run.
//
// Build: target gaugewatch_cuda (metrics.cu, metrics_launch.cu; kernel bodies
// in metrics_kernels.cuh). Tests: tests/cuda/metrics_test.cpp (GPU, and the
// CPU emulation target gaugewatch_cuda_metrics_emulation_tests).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/problem.h"
#include "kernels/reference/metric_catalogue.h"  // MetricId, kMetricCount (header-only use)

namespace gaugewatch::gpu {

inline constexpr std::size_t kMetricCount = reference::kMetricCount;

// A contiguous device tensor of a known element count (from the shape).
struct TensorView {
  const void* data = nullptr;
  ElementType type = ElementType::kBf16;
};

struct GradientViews {
  TensorView dq;  // (B, Hq, N, d)
  TensorView dk;  // (B, Hkv, M, d)
  TensorView dv;  // (B, Hkv, M, d)
};

struct MetricsParams {
  ProblemShape shape;  // head_dim 16..256, dividing 256
  // Operands, FP32 contiguous (BF16 values are exact in FP32; the FP32
  // backward takes the same copies).
  const float* q = nullptr;  // (B, Hq, N, d)
  const float* k = nullptr;  // (B, Hkv, M, d)
  // Row diagnostics of the live BF16 run, FP32 (B, Hq, N) contiguous.
  const float* row_mass = nullptr;      // rho_i
  const float* abs_row_mass = nullptr;  // sum_j |t_ij|
  GradientViews live;       // the backend in use ("bf16")
  GradientViews gproj;
  GradientViews reference;  // the FP32 recompute
  // dQ of the same backends with the keys translated (translate_keys).
  TensorView live_dq_translated;
  TensorView gproj_dq_translated;
  // Output: kMetricCount FP64 values in MetricId order (device).
  double* out = nullptr;
};

Status validate(const MetricsParams& params);
size_t metrics_workspace_bytes(const MetricsParams& params);

// Enqueues every reduction on `stream`; never synchronizes. `workspace` holds
// metrics_workspace_bytes(params) bytes of 16-byte aligned device memory.
Status attention_metrics(const MetricsParams& params, void* workspace, size_t workspace_bytes,
                         cudaStream_t stream);

// The gauge-violation operands, exactly as reference::gauge_violation builds
// them: per key/value head b = -bf16(mean key) (FP64 mean over all M keys),
//   k_out = bf16(k + b)                       (RNE, BF16 storage)
//   lse_out = float(double(lse) + alpha q_i.b)  where lse is finite, else lse
// (the exact lse moves by alpha q_i.b; the saved output does not move).
struct TranslateParams {
  ProblemShape shape;           // masking fields unused
  const float* q = nullptr;     // (B, Hq, N, d) FP32
  const float* k = nullptr;     // (B, Hkv, M, d) FP32
  const float* lse = nullptr;   // (B, Hq, N) FP32 contiguous
  uint16_t* k_out = nullptr;    // (B, Hkv, M, d) BF16 contiguous
  float* lse_out = nullptr;     // (B, Hq, N) FP32 contiguous
};

Status validate(const TranslateParams& params);
size_t translate_workspace_bytes(const TranslateParams& params);
Status translate_keys(const TranslateParams& params, void* workspace, size_t workspace_bytes,
                      cudaStream_t stream);

}  // namespace gaugewatch::gpu
