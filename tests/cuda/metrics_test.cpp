// Tests of the metric reductions (kernels/cuda/metrics.h) against the CPU
// reference (kernels/reference/metrics.cpp). The reference supplies every
// operand the kernels reduce (the emulated fused backward's row diagnostics and
// gradients, the FP32 recompute), so each metric is compared on identical
// inputs; the key translation of the gauge audit is compared bit for bit.
//
// Build: gaugewatch_cuda_metrics_tests (GPU; every test skips without an sm_90
// device) and gaugewatch_cuda_metrics_emulation_tests (the same kernel source on
// the CPU through tests/cuda/emulation; checks indexing, masking and math, not
// races). Run: build/bin/gaugewatch_cuda_metrics_tests; each case prints the
// largest relative deviation per metric.

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/metrics.h"
#include "kernels/reference/attention_problem.h"
#include "kernels/reference/bf16.h"
#include "kernels/reference/fp32_backward.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/fused_forward_bf16.h"
#include "kernels/reference/metric_catalogue.h"
#include "kernels/reference/metrics.h"
#include "kernels/reference/vector_math.h"
#include "tests/cuda/device_support.h"
#include "tests/cuda/problem_support.h"

#ifdef GAUGEWATCH_METRICS_EMULATION
// CPU emulation: this translation unit is the whole emulated runtime (the
// block runner of tests/cuda/emulation/emulation.cpp), the real host launcher
// (metrics.cu, compiled as C++) and the launchers below in place of
// metrics_launch.cu's <<<>>>. The target compiles no other copy of either.
#include "emulation.cpp"
#include "kernels/cuda/metrics.cu"
#include "kernels/cuda/metrics_kernels.cuh"

namespace gaugewatch::gpu::detail {
namespace emu = gaugewatch_emulation;

cudaError_t launch_key_centre(const CentreArgs& args, int64_t heads, cudaStream_t) {
  if (heads > 0) emu::run_grid(dim3(static_cast<unsigned>(heads)), kMetricsThreads, 0, [&] { key_centre_kernel(args); });
  return cudaSuccess;
}
cudaError_t launch_translate(const TranslateArgs& args, cudaStream_t) {
  if (args.kv_total > 0) {
    emu::run_grid(dim3(static_cast<unsigned>(args.k_blocks)), kMetricsThreads, 0, [&] { translate_keys_kernel(args); });
  }
  const auto blocks = static_cast<unsigned>((args.rows + kMetricsThreads - 1) / kMetricsThreads);
  if (blocks > 0) emu::run_grid(dim3(blocks), kMetricsThreads, 0, [&] { translate_lse_kernel(args); });
  return cudaSuccess;
}
cudaError_t launch_geometry(const GeometryArgs& args, int64_t slices, cudaStream_t) {
  const dim3 grid(static_cast<unsigned>((args.n + kGeoRows - 1) / kGeoRows), static_cast<unsigned>(slices));
  emu::run_grid(grid, kMetricsThreads, geometry_smem_bytes(args.d), [&] { geometry_kernel(args); });
  return cudaSuccess;
}
cudaError_t launch_row_finish(const GeometryArgs& args, int64_t rows, cudaStream_t) {
  const auto blocks = static_cast<unsigned>((rows + kMetricsThreads - 1) / kMetricsThreads);
  if (blocks > 0) emu::run_grid(dim3(blocks), kMetricsThreads, 0, [&] { row_finish_kernel(args, rows); });
  return cudaSuccess;
}
cudaError_t launch_row_stats(const RowStatsArgs& args, cudaStream_t) {
  emu::run_grid(dim3(kRowBlocks), kMetricsThreads, 0, [&] { row_stats_kernel(args); });
  return cudaSuccess;
}
cudaError_t launch_norms(const NormArgs& args, cudaStream_t) {
  emu::run_grid(dim3(kNormBlocks, kNormJobs), kMetricsThreads, 0, [&] { norms_kernel(args); });
  return cudaSuccess;
}
cudaError_t launch_medians(const MedianArgs& args, cudaStream_t) {
  emu::run_grid(dim3(kMedians), kMetricsThreads, 0, [&] { medians_kernel(args); });
  return cudaSuccess;
}
cudaError_t launch_finish(const FinishArgs& args, cudaStream_t) {
  emu::run_grid(dim3(1), 32, 0, [&] { finish_kernel(args); });
  return cudaSuccess;
}

}  // namespace gaugewatch::gpu::detail
#endif

namespace gaugewatch {
namespace {

namespace ref = gaugewatch::reference;
using ref::MetricId;

static_assert(gpu::kMetricCount == ref::kMetricCount);

// Why no test can run, or "" when a CUDA device is present.
using testing_cuda::Case;
using testing_cuda::DeviceBuffer;
using testing_cuda::make_inputs;
using testing_cuda::shape;
using testing_cuda::to_bf16_bits;
using testing_cuda::to_int32;


// The reference's translated operands (reference::gauge_violation, restated).
struct Translated {
  std::vector<float> k;
  std::vector<float> lse;
};
Translated reference_translation(const ref::AttentionInputs& in, const ref::SavedForward& saved) {
  const auto& sh = in.shape;
  const int64_t d = sh.head_dim;
  Translated t{in.k, saved.lse};
  std::vector<double> mean(static_cast<size_t>(d));
  std::vector<float> shift(static_cast<size_t>(d));
  for (int64_t b = 0; b < sh.batch; ++b) {
    for (int64_t hk = 0; hk < sh.kv_heads; ++hk) {
      std::fill(mean.begin(), mean.end(), 0.0);
      const float* k0 = &in.k[static_cast<size_t>(sh.kv_offset(b, hk, 0))];
      for (int64_t j = 0; j < sh.kv_len; ++j) ref::axpy(1.0, k0 + j * d, mean.data(), d);
      for (int64_t c = 0; c < d; ++c) {
        shift[c] = -ref::round_bf16(static_cast<float>(mean[c] / static_cast<double>(sh.kv_len)));
      }
      float* k1 = &t.k[static_cast<size_t>(sh.kv_offset(b, hk, 0))];
      for (int64_t j = 0; j < sh.kv_len; ++j) {
        for (int64_t c = 0; c < d; ++c) k1[j * d + c] = ref::round_bf16(k0[j * d + c] + shift[c]);
      }
      for (int64_t h = hk * sh.group(); h < (hk + 1) * sh.group(); ++h) {
        for (int64_t n = 0; n < sh.q_len; ++n) {
          float& lse = t.lse[static_cast<size_t>(sh.lse_offset(b, h, n))];
          if (!std::isfinite(lse)) continue;
          lse = static_cast<float>(static_cast<double>(lse) +
                                   in.scale * ref::dot<double>(&in.q[sh.q_offset(b, h, n)], shift.data(), d));
        }
      }
    }
  }
  return t;
}

gpu::ProblemShape metrics_shape(const ref::AttentionInputs& in, const int32_t* cu_q, const int32_t* cu_k) {
  return testing_cuda::problem_shape(in, cu_q, cu_k);
}


struct TranslateResult {
  gpu::Status status;
  std::vector<uint16_t> k_bits;
  std::vector<float> lse;
};

TranslateResult run_translate(const ref::AttentionInputs& in, const ref::SavedForward& saved) {
  DeviceBuffer<float> q(in.q), k(in.k), lse(saved.lse);
  DeviceBuffer<uint16_t> k_out(in.k.size());
  DeviceBuffer<float> lse_out(saved.lse.size());
  k_out.poison();
  lse_out.poison();
  gpu::TranslateParams p;
  p.shape = metrics_shape(in, nullptr, nullptr);
  p.shape.cu_seqlens_q = p.shape.cu_seqlens_k = nullptr;
  p.shape.num_segments = 0;
  p.q = q.get();
  p.k = k.get();
  p.lse = lse.get();
  p.k_out = k_out.get();
  p.lse_out = lse_out.get();
  const size_t bytes = gpu::translate_workspace_bytes(p);
  DeviceBuffer<unsigned char> ws(bytes);
  TranslateResult r;
  r.status = gpu::translate_keys(p, ws.get(), bytes, nullptr);
  const cudaError_t sync = cudaDeviceSynchronize();
  if (r.status.ok() && sync != cudaSuccess) r.status = gpu::Status{sync, cudaGetErrorString(sync)};
  r.k_bits = k_out.download();
  r.lse = lse_out.download();
  return r;
}

struct MetricsResult {
  gpu::Status status;
  std::vector<double> values;
};

// The reference's attn_mask bias as the kernels read it: a float bias with
// element strides from its (broadcast) sizes, 0 along broadcast dimensions.
gpu::AttentionMask device_bias(const ref::AttentionBias& bias, const float* data) {
  gpu::AttentionMask m;
  if (bias.empty()) return m;
  m.kind = gpu::MaskKind::kBias;
  m.data = data;
  int64_t stride = 1;
  for (int i = 3; i >= 0; --i) {
    m.strides[i] = bias.sizes[static_cast<size_t>(i)] > 1 ? stride : 0;
    stride *= bias.sizes[static_cast<size_t>(i)];
  }
  return m;
}

// The reduction kernels on the reference's operands: live = the emulated
// fused BF16 backward ("plain"), its row diagnostics, gproj, the FP32
// recompute, and the translated runs' dQ.
MetricsResult run_metrics(const ref::AttentionInputs& in, const ref::FusedBackward& fused, const ref::Gradients& fp32,
                          const ref::FusedBackward& translated) {
  DeviceBuffer<float> q(in.q), k(in.k);
  DeviceBuffer<float> row_mass(fused.rows.row_mass), abs_row_mass(fused.rows.abs_row_mass);
  DeviceBuffer<uint16_t> live_dq(to_bf16_bits(fused.plain.dq)), live_dk(to_bf16_bits(fused.plain.dk)),
      live_dv(to_bf16_bits(fused.plain.dv));
  DeviceBuffer<uint16_t> gproj_dq(to_bf16_bits(fused.gproj.dq)), gproj_dk(to_bf16_bits(fused.gproj.dk)),
      gproj_dv(to_bf16_bits(fused.gproj.dv));
  DeviceBuffer<float> ref_dq(fp32.dq), ref_dk(fp32.dk), ref_dv(fp32.dv);
  DeviceBuffer<uint16_t> live_t(to_bf16_bits(translated.plain.dq)), gproj_t(to_bf16_bits(translated.gproj.dq));
  DeviceBuffer<int32_t> cu_q(to_int32(in.cu_seqlens_q)), cu_k(to_int32(in.cu_seqlens_k));
  DeviceBuffer<double> out(gpu::kMetricCount);
  out.poison();
  DeviceBuffer<float> bias(in.bias.values);

  using gpu::ElementType;
  gpu::MetricsParams p;
  p.shape = metrics_shape(in, cu_q.get(), cu_k.get());
  p.shape.mask = device_bias(in.bias, bias.get());
  p.q = q.get();
  p.k = k.get();
  p.row_mass = row_mass.get();
  p.abs_row_mass = abs_row_mass.get();
  p.live = {{live_dq.get(), ElementType::kBf16}, {live_dk.get(), ElementType::kBf16}, {live_dv.get(), ElementType::kBf16}};
  p.gproj = {{gproj_dq.get(), ElementType::kBf16},
             {gproj_dk.get(), ElementType::kBf16},
             {gproj_dv.get(), ElementType::kBf16}};
  p.reference = {{ref_dq.get(), ElementType::kFp32}, {ref_dk.get(), ElementType::kFp32}, {ref_dv.get(), ElementType::kFp32}};
  p.live_dq_translated = {live_t.get(), ElementType::kBf16};
  p.gproj_dq_translated = {gproj_t.get(), ElementType::kBf16};
  p.out = out.get();
  const size_t bytes = gpu::metrics_workspace_bytes(p);
  DeviceBuffer<unsigned char> ws(bytes);
  // Poisoned workspace: a partial or row value read before it is written is NaN.
  ws.poison();
  MetricsResult r;
  r.status = gpu::attention_metrics(p, ws.get(), bytes, nullptr);
  const cudaError_t sync = cudaDeviceSynchronize();
  if (r.status.ok() && sync != cudaSuccess) r.status = gpu::Status{sync, cudaGetErrorString(sync)};
  r.values = out.download();
  return r;
}

// Relative tolerance per metric. Row mass, discrepancies, gauge violations and
// key RMS reduce the same numbers as the reference in another order (FP64 vs
// long double): ~1e-12. Key geometry uses FP32 centred logits where the
// reference has FP64 ones (~1e-6 relative in p); sharp fraction is a count.
double tolerance(MetricId id) {
  switch (id) {
    case MetricId::kKeyOffsetMedian:
    case MetricId::kKeyOffsetMax:
    case MetricId::kKeySpreadMedian:
    case MetricId::kKeyOffsetSpreadRatioMedian:
    case MetricId::kKeyOffsetSpreadRatioMax:
    case MetricId::kLogitAbsMax: return 1e-4;
    case MetricId::kSharpRowFraction: return 0.0;
    default: return 1e-9;
  }
}

struct ReferenceRun {
  ref::AttentionInputs in;
  ref::SavedForward saved;
  ref::FusedBackward fused;
  ref::Gradients fp32;
  ref::AttentionMetrics want;
};

ReferenceRun reference_run(const Case& c) {
  ReferenceRun r;
  r.in = make_inputs(c);
  r.saved = ref::forward_fused_bf16(r.in);
  r.fused = ref::backward_fused_bf16(r.in, r.saved);
  r.fp32 = ref::backward_fp32(r.in);
  r.want = ref::compute_metrics(r.in, r.saved, r.fused, r.fp32);
  return r;
}

std::vector<Case> all_cases() {
  using ref::CausalMode;
  std::vector<Case> cases;
  auto add = [&](std::string name, ref::AttentionShape sh, CausalMode causal = CausalMode::kNone) -> Case& {
    Case c;
    c.name = std::move(name);
    c.shape = sh;
    c.causal = causal;
    c.seed = cases.size() + 101;
    cases.push_back(std::move(c));
    return cases.back();
  };
  add("random_d64", shape(1, 2, 2, 40, 72, 64));
  Case& sink = add("sink_offset300_d64", shape(1, 2, 2, 48, 48, 64), CausalMode::kTopLeft);
  sink.key_offset = 300.0f;
  sink.q_gain = 3.0f;
  Case& sharp = add("sharp_offset200_d128", shape(1, 2, 1, 36, 70, 128));
  sharp.key_offset = 200.0f;
  sharp.q_gain = 1.5f;
  add("causal_topleft_d64", shape(2, 2, 2, 50, 50, 64), CausalMode::kTopLeft);
  add("causal_bottomright_empty_rows_d64", shape(1, 2, 2, 40, 24, 64), CausalMode::kBottomRight);
  add("gqa_4to2_d128", shape(1, 4, 2, 33, 97, 128));
  add("mqa_4to1_d32", shape(1, 4, 1, 20, 20, 32), CausalMode::kTopLeft);
  Case& packed = add("packed_topleft_d64", shape(1, 2, 2, 60, 70, 64), CausalMode::kTopLeft);
  packed.cu_q = {0, 20, 20, 60};
  packed.cu_k = {0, 25, 30, 70};
  add("single_key_rows_d64", shape(1, 1, 1, 17, 1, 64));
  // attn_mask: key padding broadcast over heads and rows (batch 1 left-padded:
  // under top-left causal its first rows see no key and are left out), and an
  // additive bias per (head, row, key) with -inf entries.
  Case& padding = add("key_padding_topleft_d64", shape(2, 2, 2, 40, 50, 64), CausalMode::kTopLeft);
  padding.bias.sizes = {2, 1, 1, 50};
  padding.bias.values.assign(100, 0.0f);
  for (int j = 40; j < 50; ++j) padding.bias.values[static_cast<size_t>(j)] = -INFINITY;
  for (int j = 0; j < 5; ++j) padding.bias.values[static_cast<size_t>(50 + j)] = -INFINITY;
  Case& biased = add("additive_bias_d128", shape(1, 2, 2, 30, 45, 128));
  biased.key_offset = 50.0f;
  biased.bias.sizes = {1, 2, 30, 45};
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int i = 0; i < 2 * 30 * 45; ++i) biased.bias.values.push_back(i % 9 == 4 ? -INFINITY : normal(rng));
  return cases;
}

class MetricsCase : public ::testing::TestWithParam<Case> {};

TEST_P(MetricsCase, TranslationMatchesReferenceBitwise) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const ref::AttentionInputs in = make_inputs(c);
  const ref::SavedForward saved = ref::forward_fused_bf16(in);
  const Translated want = reference_translation(in, saved);
  const TranslateResult got = run_translate(in, saved);
  ASSERT_TRUE(got.status.ok()) << got.status.message;
  size_t k_mismatch = 0, lse_mismatch = 0;
  for (size_t i = 0; i < want.k.size(); ++i) k_mismatch += got.k_bits[i] != ref::float_to_bf16_bits(want.k[i]);
  for (size_t i = 0; i < want.lse.size(); ++i) {
    const bool same = got.lse[i] == want.lse[i] || (std::isnan(got.lse[i]) && std::isnan(want.lse[i]));
    lse_mismatch += !same;
  }
  EXPECT_EQ(k_mismatch, 0u) << c.name << ": translated keys differ from reference::gauge_violation's";
  EXPECT_EQ(lse_mismatch, 0u) << c.name << ": translated lse differs from reference::gauge_violation's";
}

TEST_P(MetricsCase, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const ReferenceRun r = reference_run(c);
  // The translated runs from the kernel's own translation (checked bitwise above).
  const TranslateResult t = run_translate(r.in, r.saved);
  ASSERT_TRUE(t.status.ok()) << t.status.message;
  ref::AttentionInputs shifted = r.in;
  for (size_t i = 0; i < shifted.k.size(); ++i) shifted.k[i] = ref::bf16_bits_to_float(t.k_bits[i]);
  const ref::SavedForward shifted_saved{r.saved.out, t.lse};
  const ref::FusedBackward translated = ref::backward_fused_bf16(shifted, shifted_saved);

  const MetricsResult got = run_metrics(r.in, r.fused, r.fp32, translated);
  ASSERT_TRUE(got.status.ok()) << c.name << ": " << got.status.message;
  ASSERT_EQ(got.values.size(), ref::kMetricCount);
  std::printf("[%s]\n", c.name.c_str());
  for (const auto& spec : ref::metric_catalogue()) {
    const auto i = static_cast<size_t>(spec.id);
    const double want = r.want.values[i], have = got.values[i];
    const double dev = std::abs(have - want) / std::max(std::abs(want), 1e-300);
    std::printf("  %-32s ref %-14.8g gpu %-14.8g rel %.2e\n", std::string(spec.name).c_str(), want, have,
                want == have ? 0.0 : dev);
    const double tol = tolerance(spec.id);
    // NaN fails both.
    EXPECT_TRUE(std::abs(have - want) <= tol * std::abs(want) + 1e-12)
        << c.name << " " << spec.name << ": gpu " << have << " vs reference " << want;
  }
}

INSTANTIATE_TEST_SUITE_P(Scenarios, MetricsCase, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) { return param_info.param.name; });

TEST(Metrics, BitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.name = "repeat";
  c.shape = shape(1, 4, 2, 70, 70, 64);
  c.causal = ref::CausalMode::kTopLeft;
  c.key_offset = 100.0f;
  const ReferenceRun r = reference_run(c);
  const MetricsResult a = run_metrics(r.in, r.fused, r.fp32, r.fused);
  const MetricsResult b = run_metrics(r.in, r.fused, r.fp32, r.fused);
  ASSERT_TRUE(a.status.ok() && b.status.ok());
  for (size_t i = 0; i < a.values.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a.values[i], &b.values[i], sizeof(double)), 0) << "metric " << i;
  }
  // dQ "translated" by nothing: both gauge violations are exactly 0.
  EXPECT_EQ(a.values[static_cast<size_t>(MetricId::kLiveGaugeViolation)], 0.0);
  EXPECT_EQ(a.values[static_cast<size_t>(MetricId::kGprojGaugeViolation)], 0.0);
}

TEST(Metrics, RejectsUnsupportedInputs) {
  SKIP_WITHOUT_GPU();
  gpu::MetricsParams p;
  p.shape.head_dim = 96;
  EXPECT_NE(gpu::validate(p).message.find("head_dim 96"), std::string::npos);
  p.shape.head_dim = 64;
  p.shape.q_heads = 3;
  p.shape.kv_heads = 2;
  EXPECT_NE(gpu::validate(p).message.find("GQA"), std::string::npos);
  p.shape.q_heads = 2;
  EXPECT_NE(gpu::validate(p).message.find("non-null"), std::string::npos);
  gpu::TranslateParams t;
  EXPECT_FALSE(gpu::validate(t).ok());
}

}  // namespace
}  // namespace gaugewatch
