// attn_mask in the reference (SDPA semantics: bool True = takes part, or an
// additive bias on the scaled scores, broadcast to (B, Hq, N, M)):
//   - the FP64 truth against a naive FP64 masked attention written here from
//     the definitions (dense mask, one formula per quantity);
//   - key padding (left and right) against the same problem with the padded
//     keys removed, for every backend: masking a key out is removing it;
//   - the FP32 recompute and GProj against the masked truth;
//   - a row whose keys are all masked gives zeros, as SDPA does;
//   - the metrics measure against the masked truth (no false alarm).

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "audit/scenarios.h"
#include "kernels/reference/errors.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fp32_backward.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/fused_forward_bf16.h"
#include "kernels/reference/metrics.h"

namespace gaugewatch::testing {
namespace {

using reference::AttentionBias;
using reference::AttentionInputs;
using reference::CausalMode;
using reference::MetricId;

constexpr float kMasked = -std::numeric_limits<float>::infinity();

AttentionInputs random_inputs(reference::AttentionShape shape, CausalMode causal, uint64_t seed,
                              double key_offset = 0.0, double gain = 1.0) {
  audit::ScenarioSpec spec;
  spec.shape = shape;
  spec.causal = causal;
  spec.seed = seed;
  spec.key_offset_rms = key_offset;
  spec.query_gain = gain;
  return audit::make_inputs(spec);
}

// Key padding of batch element b: `valid[b]` keys take part, at the end
// (left padding) or at the start (right padding). Bias shape (B, 1, 1, M).
AttentionBias key_padding(const AttentionInputs& in, const std::vector<int64_t>& valid, bool left_padded) {
  const auto& s = in.shape;
  AttentionBias bias;
  bias.sizes = {s.batch, 1, 1, s.kv_len};
  bias.values.assign(static_cast<size_t>(s.batch * s.kv_len), 0.0f);
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t j = 0; j < s.kv_len; ++j) {
      const bool takes_part = left_padded ? j >= s.kv_len - valid[b] : j < valid[b];
      if (!takes_part) bias.values[static_cast<size_t>(b * s.kv_len + j)] = kMasked;
    }
  }
  return bias;
}

// The naive FP64 attention: dense (B, Hq, N, M) bias from the definition of
// broadcasting, causal masks from their definitions, no shared code with the
// reference's row loop.
struct Naive {
  std::vector<double> out, dq, dk, dv;
};

Naive naive_attention(const AttentionInputs& in) {
  const auto& s = in.shape;
  const int64_t d = s.head_dim;
  Naive r;
  r.out.assign(s.q_elements(), 0.0);
  r.dq.assign(s.q_elements(), 0.0);
  r.dk.assign(s.kv_elements(), 0.0);
  r.dv.assign(s.kv_elements(), 0.0);
  auto bias_at = [&](int64_t b, int64_t h, int64_t n, int64_t j) -> double {
    if (in.bias.empty()) return 0.0;
    const auto& z = in.bias.sizes;
    const int64_t idx[4] = {z[0] == 1 ? 0 : b, z[1] == 1 ? 0 : h, z[2] == 1 ? 0 : n, z[3] == 1 ? 0 : j};
    return in.bias.values[static_cast<size_t>(((idx[0] * z[1] + idx[1]) * z[2] + idx[2]) * z[3] + idx[3])];
  };
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t hk = h / s.group();
      for (int64_t n = 0; n < s.q_len; ++n) {
        std::vector<double> sc(s.kv_len, -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.kv_len; ++j) {
          if (in.causal == CausalMode::kTopLeft && j > n) continue;
          if (in.causal == CausalMode::kBottomRight && j > n + s.kv_len - s.q_len) continue;
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c) dot += double(in.q[s.q_offset(b, h, n) + c]) * in.k[s.kv_offset(b, hk, j) + c];
          sc[j] = in.scale * dot + bias_at(b, h, n, j);
          mx = std::max(mx, sc[j]);
        }
        if (mx == -INFINITY) continue;
        double l = 0.0;
        std::vector<double> p(s.kv_len), a(s.kv_len);
        for (int64_t j = 0; j < s.kv_len; ++j) l += (p[j] = std::exp(sc[j] - mx));
        double delta = 0.0;
        for (int64_t j = 0; j < s.kv_len; ++j) {
          p[j] /= l;
          a[j] = 0.0;
          for (int64_t c = 0; c < d; ++c) {
            a[j] += double(in.grad_out[s.q_offset(b, h, n) + c]) * in.v[s.kv_offset(b, hk, j) + c];
            r.out[s.q_offset(b, h, n) + c] += p[j] * in.v[s.kv_offset(b, hk, j) + c];
          }
          delta += p[j] * a[j];
        }
        for (int64_t j = 0; j < s.kv_len; ++j) {
          const double g = p[j] * (a[j] - delta);
          for (int64_t c = 0; c < d; ++c) {
            r.dq[s.q_offset(b, h, n) + c] += in.scale * g * in.k[s.kv_offset(b, hk, j) + c];
            r.dk[s.kv_offset(b, hk, j) + c] += in.scale * g * in.q[s.q_offset(b, h, n) + c];
            r.dv[s.kv_offset(b, hk, j) + c] += p[j] * in.grad_out[s.q_offset(b, h, n) + c];
          }
        }
      }
    }
  }
  return r;
}

void expect_exact_matches_naive(const AttentionInputs& in) {
  const auto exact = reference::attention_fp64(in);
  const Naive naive = naive_attention(in);
  EXPECT_LT(reference::relative_error(exact.out, naive.out), 1e-12);
  EXPECT_LT(reference::relative_error(exact.dq, naive.dq), 1e-12);
  EXPECT_LT(reference::relative_error(exact.dk, naive.dk), 1e-12);
  EXPECT_LT(reference::relative_error(exact.dv, naive.dv), 1e-12);
}

TEST(AttentionMask, KeyPaddingBothSidesMatchesNaiveFp64) {
  for (bool left : {false, true}) {
    AttentionInputs in = random_inputs({3, 2, 2, 24, 40, 64}, CausalMode::kNone, 7);
    in.bias = key_padding(in, {40, 17, 1}, left);
    SCOPED_TRACE(left ? "left padded" : "right padded");
    expect_exact_matches_naive(in);
  }
}

TEST(AttentionMask, AdditiveBiasOfEveryBroadcastShapeMatchesNaiveFp64) {
  const AttentionInputs base = random_inputs({2, 4, 2, 16, 20, 32}, CausalMode::kNone, 11);
  const std::array<int64_t, 4> shapes[] = {{1, 1, 1, 20}, {1, 1, 16, 20}, {1, 4, 16, 20}, {2, 1, 1, 20},
                                           {2, 4, 16, 20}, {1, 4, 1, 1},  {2, 1, 16, 1}};
  uint32_t state = 12345;
  for (const auto& z : shapes) {
    AttentionInputs in = base;
    in.bias.sizes = z;
    in.bias.values.resize(static_cast<size_t>(z[0] * z[1] * z[2] * z[3]));
    for (auto& x : in.bias.values) {
      state = state * 1664525u + 1013904223u;
      x = static_cast<float>((state >> 8) % 4001) / 500.0f - 4.0f;  // [-4, 4]
      if ((state >> 4) % 11 == 0) x = kMasked;
    }
    SCOPED_TRACE(::testing::Message() << "bias (" << z[0] << ", " << z[1] << ", " << z[2] << ", " << z[3] << ")");
    expect_exact_matches_naive(in);
  }
}

TEST(AttentionMask, CombinesWithCausalMasking) {
  for (CausalMode causal : {CausalMode::kTopLeft, CausalMode::kBottomRight}) {
    AttentionInputs in = random_inputs({2, 2, 1, 30, 40, 64}, causal, 13);
    in.bias = key_padding(in, {40, 25}, /*left_padded=*/true);
    SCOPED_TRACE(reference::to_string(causal));
    expect_exact_matches_naive(in);
  }
}

// Masking keys out is removing them: every backward returns, bit for bit, the
// gradients of the problem without the padded keys (and zero dK, dV for them).
TEST(AttentionMask, PaddedKeysAreRemovedKeysForEveryBackend) {
  const int64_t valid = 37, m = 50;
  for (bool left : {false, true}) {
    SCOPED_TRACE(left ? "left padded" : "right padded");
    AttentionInputs padded = random_inputs({1, 2, 1, 32, m, 64}, CausalMode::kNone, 17, 50.0, 10.0);
    padded.bias = key_padding(padded, {valid}, left);
    AttentionInputs trimmed = padded;
    trimmed.bias = {};
    trimmed.shape.kv_len = valid;
    const int64_t first = left ? m - valid : 0;
    const int64_t d = padded.shape.head_dim;
    trimmed.k.assign(padded.k.begin() + first * d, padded.k.begin() + (first + valid) * d);
    trimmed.v.assign(padded.v.begin() + first * d, padded.v.begin() + (first + valid) * d);

    // The forward takes the row max over the biased scores, so it may differ
    // from the unmasked arithmetic by rounding; the backwards share saved_t.
    const auto saved_p = reference::forward_fused_bf16(padded);
    const auto saved_t = reference::forward_fused_bf16(trimmed);
    EXPECT_LT(reference::relative_error(saved_p.out, saved_t.out), 1e-2);
    EXPECT_LT(reference::relative_error(saved_p.lse, saved_t.lse), 1e-6);
    const auto fused_p = reference::backward_fused_bf16(padded, saved_t);
    const auto fused_t = reference::backward_fused_bf16(trimmed, saved_t);
    const auto fp32_p = reference::backward_fp32(padded, {/*center_keys=*/false});
    const auto fp32_t = reference::backward_fp32(trimmed, {/*center_keys=*/false});
    auto kept = [&](const std::vector<float>& kv) {
      return std::vector<float>(kv.begin() + first * d, kv.begin() + (first + valid) * d);
    };
    for (const auto* pair : {&fused_p.plain, &fused_p.gproj, &fused_p.pivot}) {
      const auto& t = pair == &fused_p.plain ? fused_t.plain : (pair == &fused_p.gproj ? fused_t.gproj : fused_t.pivot);
      EXPECT_EQ(pair->dq, t.dq);
      EXPECT_EQ(kept(pair->dk), t.dk);
      EXPECT_EQ(kept(pair->dv), t.dv);
    }
    EXPECT_EQ(fp32_p.dq, fp32_t.dq);
    EXPECT_EQ(kept(fp32_p.dk), fp32_t.dk);
    for (int64_t j = 0; j < m; ++j) {
      if (j >= first && j < first + valid) continue;
      for (int64_t c = 0; c < d; ++c) {
        ASSERT_EQ(fused_p.gproj.dk[j * d + c], 0.0f);
        ASSERT_EQ(fp32_p.dv[j * d + c], 0.0f);
      }
    }
  }
}

TEST(AttentionMask, Fp32AndGprojMeasuredAgainstTheMaskedTruth) {
  AttentionInputs in = random_inputs({2, 2, 2, 64, 64, 64}, CausalMode::kTopLeft, 19, 200.0, 20.0);
  in.bias = key_padding(in, {64, 40}, /*left_padded=*/true);
  const auto exact = reference::attention_fp64(in);
  const auto fp32 = reference::backward_fp32(in);
  EXPECT_LT(reference::relative_error(fp32.dq, exact.dq), 1e-4);
  EXPECT_LT(reference::relative_error(fp32.dk, exact.dk), 1e-4);
  const auto saved = reference::forward_fused_bf16(in);
  const auto fused = reference::backward_fused_bf16(in, saved);
  EXPECT_GT(reference::relative_error(fused.plain.dq, exact.dq), 0.3) << "sink-like operands leak in plain BF16";
  EXPECT_LT(reference::relative_error(fused.gproj.dq, exact.dq), 0.01);
  EXPECT_LT(reference::relative_error(fused.pivot.dq, exact.dq), 0.01);
}

TEST(AttentionMask, FullyMaskedRowsGiveZerosAsSdpa) {
  AttentionInputs in = random_inputs({1, 2, 2, 8, 12, 64}, CausalMode::kNone, 23);
  in.bias.sizes = {1, 1, 8, 1};  // rows 2 and 5 see nothing
  in.bias.values.assign(8, 0.0f);
  in.bias.values[2] = in.bias.values[5] = kMasked;
  const auto exact = reference::attention_fp64(in);
  const auto saved = reference::forward_fused_bf16(in);
  const auto fused = reference::backward_fused_bf16(in, saved);
  const auto fp32 = reference::backward_fp32(in);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t n : {2, 5}) {
      const int64_t row = in.shape.lse_offset(0, h, n);
      EXPECT_TRUE(std::isinf(saved.lse[row]));
      for (int64_t c = 0; c < 64; ++c) {
        ASSERT_EQ(exact.out[row * 64 + c], 0.0);
        ASSERT_EQ(saved.out[row * 64 + c], 0.0f);
        ASSERT_EQ(exact.dq[row * 64 + c], 0.0);
        ASSERT_EQ(fp32.dq[row * 64 + c], 0.0f);
        ASSERT_EQ(fused.gproj.dq[row * 64 + c], 0.0f);
      }
      EXPECT_EQ(fused.rows.pivot[row], -1);
    }
  }
  // The other rows are unaffected: their gradients match the naive truth.
  expect_exact_matches_naive(in);
  // SDPA's CPU flash op saves lse = 0 for such rows: the emulation reads them as rows with no key.
  reference::SavedForward zero_lse = saved;
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t n : {2, 5}) zero_lse.lse[in.shape.lse_offset(0, h, n)] = 0.0f;
  }
  EXPECT_EQ(reference::backward_fused_bf16(in, zero_lse).plain.dq, fused.plain.dq);
}

// A padding-masked call whose truth is well conditioned reads as such: the
// live discrepancy is measured against the masked FP32 recompute.
TEST(AttentionMask, MetricsMeasureTheMaskedCall) {
  AttentionInputs in = random_inputs({2, 2, 2, 64, 96, 64}, CausalMode::kNone, 29);
  // Padded keys that would dominate if the mask were ignored.
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t hk = 0; hk < 2; ++hk) {
      for (int64_t j = 60; j < 96; ++j) {
        for (int64_t c = 0; c < 64; ++c) in.k[in.shape.kv_offset(b, hk, j) + c] = 300.0f;
      }
    }
  }
  in.bias = key_padding(in, {60, 60}, /*left_padded=*/false);
  const auto saved = reference::forward_fused_bf16(in);
  const auto fused = reference::backward_fused_bf16(in, saved);
  const auto metrics = reference::compute_metrics(in, saved, fused, reference::backward_fp32(in));
  const auto exact = reference::attention_fp64(in);
  const double truth = reference::relative_error(fused.plain.dq, exact.dq);
  EXPECT_LT(truth, 0.01);
  EXPECT_NEAR(metrics[MetricId::kLiveDqDiscrepancy], truth, 0.05 * truth);
  EXPECT_LT(metrics[MetricId::kKeyOffsetMedian], 20.0) << "masked keys carry no probability";
}

TEST(AttentionMask, InvalidBiasShapesAreRejected) {
  AttentionInputs in = random_inputs({1, 2, 2, 4, 6, 32}, CausalMode::kNone, 31);
  in.bias.sizes = {1, 1, 4, 5};  // M is 6
  in.bias.values.assign(20, 0.0f);
  EXPECT_THROW(in.validate(), std::invalid_argument);
  in.bias.sizes = {1, 1, 4, 6};
  in.bias.values.assign(23, 0.0f);
  EXPECT_THROW(in.validate(), std::invalid_argument);
}

}  // namespace
}  // namespace gaugewatch::testing
