// Launcher of the metric reductions: validates, carves the workspace and
// enqueues the kernels of metrics_kernels.cuh in order (centre, geometry, row
// finish, row partials, norms, medians, finish). Math: kernels/cuda/metrics.h.
// Host code only (no <<<>>>; metrics_launch.cu launches), so the CPU emulation
// compiles this same file against its runtime.
// Build: target gaugewatch_cuda (sm_90a). Run: build/bin/gaugewatch_cuda_metrics_tests.

#include "kernels/cuda/metrics.h"

#include <cstdint>
#include <string>
#include <utility>

#include "kernels/cuda/launch_checks.h"
#include "kernels/cuda/metrics_args.cuh"

namespace gaugewatch::gpu {

namespace detail {

size_t geometry_smem_bytes(int d) {
  const size_t ld = static_cast<size_t>(d) + 4;
  return sizeof(float) * ((2 * kGeoRows + kGeoKeys) * ld + static_cast<size_t>(kGeoRows) * kGeoKeys);
}

}  // namespace detail

namespace {

using checks::aligned16;
using checks::cuda_failure;
using checks::invalid;
using checks::kMaxGridY;
using checks::round_up;

constexpr int64_t kMaxTranslateBlocks = 4096;

Status validate_shape(const ProblemShape& s) {
  if (s.head_dim < 16 || s.head_dim > detail::kMaxHeadDim || detail::kMetricsThreads % s.head_dim != 0 ||
      s.head_dim % detail::kGeoLanes != 0) {
    return invalid("head_dim " + std::to_string(s.head_dim) + " is not supported (16, 32, 64, 128 or 256)");
  }
  if (s.batch < 1 || s.q_heads < 1 || s.kv_heads < 1 || s.q_len < 1 || s.kv_len < 1) {
    return invalid("every dimension (batch, q_heads, kv_heads, q_len, kv_len) must be >= 1");
  }
  if (Status st = checks::check_heads_and_lengths(s.q_heads, s.kv_heads, s.q_len, s.kv_len); !st.ok()) return st;
  if (s.batch * s.q_heads > kMaxGridY) return invalid("batch * q_heads exceeds 65535");
  if (Status st = checks::check_mask(s.mask); !st.ok()) return st;
  return checks::check_packing(s.cu_seqlens_q, s.cu_seqlens_k, s.num_segments);
}

bool valid_view(const TensorView& t) {
  return t.data != nullptr && (t.type == ElementType::kBf16 || t.type == ElementType::kFp32);
}

struct Layout {
  size_t centre = 0, offset = 0, spread = 0, ratio = 0, p_max = 0, logit = 0, row_partials = 0,
         norm_partials = 0, medians = 0, total = 0;
};

Layout layout_of(const ProblemShape& s) {
  Layout w;
  const size_t rows = static_cast<size_t>(s.q_rows()) * sizeof(double);
  size_t at = 0;
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at += round_up(bytes);
    return here;
  };
  w.centre = take(static_cast<size_t>(s.batch * s.kv_heads * s.head_dim) * sizeof(float));
  w.offset = take(rows);
  w.spread = take(rows);
  w.ratio = take(rows);
  w.p_max = take(rows);
  w.logit = take(rows);
  w.row_partials = take(sizeof(double) * detail::kRowBlocks * detail::kRowStats);
  w.norm_partials = take(sizeof(double) * detail::kNormJobs * detail::kNormBlocks * 2);
  w.medians = take(sizeof(double) * detail::kMedians);
  w.total = at;
  return w;
}

}  // namespace

Status validate(const MetricsParams& p) {
  Status status = validate_shape(p.shape);
  if (!status.ok()) return status;
  if (p.q == nullptr || p.k == nullptr || p.row_mass == nullptr || p.abs_row_mass == nullptr || p.out == nullptr) {
    return invalid("q, k, row_mass, abs_row_mass and out must be non-null");
  }
  for (const GradientViews* g : {&p.live, &p.gproj, &p.reference}) {
    if (!valid_view(g->dq) || !valid_view(g->dk) || !valid_view(g->dv)) {
      return invalid("every gradient (live, gproj, reference dq/dk/dv) must be non-null, BF16 or FP32");
    }
  }
  if (!valid_view(p.live_dq_translated) || !valid_view(p.gproj_dq_translated)) {
    return invalid("live_dq_translated and gproj_dq_translated must be non-null, BF16 or FP32");
  }
  if (!aligned16(p.q) || !aligned16(p.k)) return invalid("q and k must be 16-byte aligned (float4 access)");
  return {};
}

size_t metrics_workspace_bytes(const MetricsParams& params) { return layout_of(params.shape).total; }

Status attention_metrics(const MetricsParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Status status = validate(p);
  if (!status.ok()) return status;
  const ProblemShape& s = p.shape;
  const Layout w = layout_of(s);
  status = checks::check_workspace(workspace, workspace_bytes, w.total);
  if (!status.ok()) return status;
  if (!aligned16(workspace)) return invalid("workspace must be 16-byte aligned");
  char* ws = static_cast<char*>(workspace);
  auto at = [ws](size_t offset) { return reinterpret_cast<double*>(ws + offset); };
  float* centre = reinterpret_cast<float*>(ws + w.centre);
  const int d = static_cast<int>(s.head_dim);

  cudaError_t err = detail::launch_key_centre(detail::CentreArgs{p.k, centre, s.kv_len, d}, s.batch * s.kv_heads,
                                              stream);
  if (err != cudaSuccess) return cuda_failure("metrics key centre", err);

  detail::GeometryArgs g{};
  g.cu_q = s.cu_seqlens_q;
  g.cu_k = s.cu_seqlens_k;
  g.num_segments = static_cast<int>(s.num_segments);
  g.causal = static_cast<int>(s.causal);
  g.mask = s.mask;
  g.q = p.q;
  g.k = p.k;
  g.centre = centre;
  g.offset = at(w.offset);
  g.spread = at(w.spread);
  g.ratio = at(w.ratio);
  g.p_max = at(w.p_max);
  g.logit_max = at(w.logit);
  g.hq = s.q_heads;
  g.hkv = s.kv_heads;
  g.n = s.q_len;
  g.m = s.kv_len;
  g.d = d;
  g.scale_f = static_cast<float>(s.scale);
  g.scale = s.scale;
  err = detail::launch_geometry(g, s.batch * s.q_heads, stream);
  if (err != cudaSuccess) return cuda_failure("metrics geometry", err);
  err = detail::launch_row_finish(g, s.q_rows(), stream);
  if (err != cudaSuccess) return cuda_failure("metrics row finish", err);

  err = detail::launch_row_stats(detail::RowStatsArgs{p.row_mass, p.abs_row_mass, g.offset, g.ratio, g.p_max,
                                                      g.logit_max, s.q_rows(), at(w.row_partials)},
                                 stream);
  if (err != cudaSuccess) return cuda_failure("metrics row statistics", err);

  detail::NormArgs norms{};
  auto job = [](const TensorView& x, const TensorView* ref, int64_t count) {
    return detail::NormJob{x.data, ref != nullptr ? ref->data : nullptr, count, static_cast<int>(x.type),
                           ref != nullptr ? static_cast<int>(ref->type) : 0};
  };
  const int64_t nq = s.q_elements(), nk = s.kv_elements();
  norms.jobs[detail::kJobLiveDq] = job(p.live.dq, &p.reference.dq, nq);
  norms.jobs[detail::kJobLiveDk] = job(p.live.dk, &p.reference.dk, nk);
  norms.jobs[detail::kJobLiveDv] = job(p.live.dv, &p.reference.dv, nk);
  norms.jobs[detail::kJobGprojDq] = job(p.gproj.dq, &p.reference.dq, nq);
  norms.jobs[detail::kJobGprojDk] = job(p.gproj.dk, &p.reference.dk, nk);
  norms.jobs[detail::kJobGprojDv] = job(p.gproj.dv, &p.reference.dv, nk);
  // Gauge violation: the translated run against the untranslated one.
  norms.jobs[detail::kJobLiveGauge] = job(p.live_dq_translated, &p.live.dq, nq);
  norms.jobs[detail::kJobGprojGauge] = job(p.gproj_dq_translated, &p.gproj.dq, nq);
  norms.jobs[detail::kJobKeySquares] = job(TensorView{p.k, ElementType::kFp32}, nullptr, nk);
  norms.partials = at(w.norm_partials);
  err = detail::launch_norms(norms, stream);
  if (err != cudaSuccess) return cuda_failure("metrics norms", err);

  err = detail::launch_medians(detail::MedianArgs{{g.offset, g.spread, g.ratio}, s.q_rows(), at(w.medians)}, stream);
  if (err != cudaSuccess) return cuda_failure("metrics medians", err);

  err = detail::launch_finish(
      detail::FinishArgs{at(w.row_partials), at(w.norm_partials), at(w.medians), s.batch * s.kv_heads * s.kv_len, p.out},
      stream);
  if (err != cudaSuccess) return cuda_failure("metrics finish", err);
  return {};
}

Status validate(const TranslateParams& p) {
  ProblemShape s = p.shape;
  s.cu_seqlens_q = s.cu_seqlens_k = nullptr;  // masking plays no part in the translation
  Status status = validate_shape(s);
  if (!status.ok()) return status;
  if (p.q == nullptr || p.k == nullptr || p.lse == nullptr || p.k_out == nullptr || p.lse_out == nullptr) {
    return invalid("q, k, lse, k_out and lse_out must be non-null");
  }
  return {};
}

size_t translate_workspace_bytes(const TranslateParams& p) {
  return round_up(static_cast<size_t>(p.shape.batch * p.shape.kv_heads * p.shape.head_dim) * sizeof(float));
}

Status translate_keys(const TranslateParams& p, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  Status status = validate(p);
  if (!status.ok()) return status;
  status = checks::check_workspace(workspace, workspace_bytes, translate_workspace_bytes(p));
  if (!status.ok()) return status;
  const ProblemShape& s = p.shape;
  float* centre = static_cast<float*>(workspace);
  const int d = static_cast<int>(s.head_dim);
  cudaError_t err = detail::launch_key_centre(detail::CentreArgs{p.k, centre, s.kv_len, d}, s.batch * s.kv_heads,
                                              stream);
  if (err != cudaSuccess) return cuda_failure("translate key centre", err);
  detail::TranslateArgs t{};
  t.q = p.q;
  t.k = p.k;
  t.centre = centre;
  t.lse = p.lse;
  t.k_out = p.k_out;
  t.lse_out = p.lse_out;
  t.kv_total = s.kv_elements();
  t.rows = s.q_rows();
  t.hq = s.q_heads;
  t.hkv = s.kv_heads;
  t.n = s.q_len;
  t.m = s.kv_len;
  t.d = d;
  t.scale = s.scale;
  const int64_t blocks = (t.kv_total + detail::kMetricsThreads - 1) / detail::kMetricsThreads;
  t.k_blocks = blocks < kMaxTranslateBlocks ? blocks : kMaxTranslateBlocks;
  err = detail::launch_translate(t, stream);
  if (err != cudaSuccess) return cuda_failure("translate keys", err);
  return {};
}

}  // namespace gaugewatch::gpu
