// The two-key bound of docs/numerics.md. With weights 1 - eps, eps the injected
// term alpha rho_i mu_k,i relative to the true dq_i is at most
// 2 u_b ||mu_k,i|| / ||k_1 - k_2||, independent of eps (sharpness). The
// bound is about the BF16 rounding of dS, so delta is taken from P dP (the
// saved-output channel is a separate source), the logits are kept small (the
// FP32 normalization of P is a third one) and outputs are not rounded.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "audit/random_normal.h"
#include "audit/scenarios.h"
#include "kernels/reference/bf16.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/fused_forward_bf16.h"

namespace gaugewatch::testing {
namespace {

double norm(const double* x, int64_t d) {
  double s = 0.0;
  for (int64_t c = 0; c < d; ++c) s += x[c] * x[c];
  return std::sqrt(s);
}

// Two keys per head sharing an offset c e_0 that the queries do not see
// (q[0] = 0): the mean key is large while the logits stay small, so the FP32
// softmax normalization adds no row mass of its own and the test isolates
// the BF16 rounding of dS that the bound is about.
reference::AttentionInputs two_key_inputs(uint64_t seed) {
  reference::AttentionInputs in;
  const int64_t heads = 8, n = 256, d = 64;
  in.shape = {1, heads, heads, n, 2, d};
  in.scale = 0.125;
  audit::RandomNormal rng(seed);
  auto fill = [&](std::vector<float>& t, int64_t count, double gain) {
    t.resize(count);
    for (auto& x : t) x = reference::round_bf16(static_cast<float>(gain * rng()));
  };
  fill(in.k, heads * 2 * d, 1.0);
  fill(in.v, heads * 2 * d, 1.0);
  fill(in.grad_out, heads * n * d, 1.0);
  in.q.resize(heads * n * d);
  const double offsets[] = {0, 64, 512, 4096};
  const double gains[] = {0.5, 1, 2, 4};
  for (int64_t h = 0; h < heads; ++h) {
    const double offset = offsets[h % 4] * static_cast<double>(1 + seed % 3);
    for (int64_t j = 0; j < 2; ++j) {
      float& k0 = in.k[(h * 2 + j) * d];
      k0 = reference::round_bf16(static_cast<float>(k0 + offset));
    }
    for (int64_t i = 0; i < n * d; ++i) {
      in.q[h * n * d + i] = i % d == 0 ? 0.0f : reference::round_bf16(static_cast<float>(gains[h / 2 % 4] * rng()));
    }
  }
  in.validate();
  return in;
}

struct RowTerms {
  double eps, g1, a1, a2, delta_exact;
};

// Exact per-row quantities of a two-key row.
RowTerms row_terms(const reference::AttentionInputs& in, const reference::ExactAttention& exact, int64_t h,
                   int64_t n) {
  const auto& sh = in.shape;
  const int64_t d = sh.head_dim;
  const float* q = &in.q[sh.q_offset(0, h, n)];
  const float* u = &in.grad_out[sh.q_offset(0, h, n)];
  double s1 = 0.0, a1 = 0.0, a2 = 0.0;
  for (int64_t c = 0; c < d; ++c) {
    s1 += static_cast<double>(q[c]) * in.k[sh.kv_offset(0, h, 0) + c];
    a1 += static_cast<double>(u[c]) * in.v[sh.kv_offset(0, h, 0) + c];
    a2 += static_cast<double>(u[c]) * in.v[sh.kv_offset(0, h, 1) + c];
  }
  const double p1 = std::exp(in.scale * s1 - exact.lse[sh.lse_offset(0, h, n)]);
  return {std::min(p1, 1.0 - p1), p1 * (1.0 - p1) * (a1 - a2), a1, a2, p1 * a1 + (1.0 - p1) * a2};
}

// Rows where FP32 rounding in P (dP - delta), ~2^-24 (|a_1| + |a_2|), is far
// below the BF16 rounding u_b |g_1|: elsewhere the gradient is lost to FP32.
bool well_conditioned(const RowTerms& r) {
  return r.eps >= 1e-3 && r.eps * std::abs(r.a1 - r.a2) >= 1e-3 * (std::abs(r.a1) + std::abs(r.a2));
}

double fp32_noise(const RowTerms& r) { return 8.0 * 0x1.0p-24 * (std::abs(r.a1) + std::abs(r.a2)); }

// The rounding channel alone (delta from P dP): |rho| <= 2 u_b |g_1|, so the
// injected alpha rho mu_k relative to the true dq is at most
// 2 u_b ||mu_k|| / ||k_1 - k_2||, for every eps; end to end the spread term
// adds u_b.
TEST(TwoKeyBound, RoundingChannelWithinBoundForAnySharpness) {
  constexpr double ub = reference::kBf16UnitRoundoff;
  int64_t rows_checked = 0;
  double smallest_eps = 1.0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const auto in = two_key_inputs(seed);
    const auto saved = reference::forward_fused_bf16(in);
    const auto exact = reference::attention_fp64(in);
    reference::FusedBackwardOptions options;
    options.delta_source = reference::DeltaSource::kProbabilities;
    options.round_outputs = false;
    const auto fused = reference::backward_fused_bf16(in, saved, options);
    const auto& sh = in.shape;
    const int64_t d = sh.head_dim;
    for (int64_t h = 0; h < sh.q_heads; ++h) {
      const float* k1 = &in.k[sh.kv_offset(0, h, 0)];
      const float* k2 = &in.k[sh.kv_offset(0, h, 1)];
      std::vector<double> diff(d), mu(d);
      for (int64_t n = 0; n < sh.q_len; ++n) {
        const RowTerms r = row_terms(in, exact, h, n);
        if (!well_conditioned(r)) continue;
        const int64_t row = sh.lse_offset(0, h, n);
        double w1 = 0.0;  // weight of key 1
        {
          double s1 = 0.0;
          for (int64_t c = 0; c < d; ++c) s1 += static_cast<double>(in.q[sh.q_offset(0, h, n) + c]) * k1[c];
          w1 = std::exp(in.scale * s1 - exact.lse[row]);
        }
        for (int64_t c = 0; c < d; ++c) {
          diff[c] = static_cast<double>(k1[c]) - k2[c];
          mu[c] = w1 * k1[c] + (1.0 - w1) * k2[c];
        }
        const double rho = std::abs(static_cast<double>(fused.rows.row_mass[row]));
        EXPECT_LE(rho, 2.0 * ub * std::abs(r.g1) + fp32_noise(r)) << "head " << h << " row " << n;
        const double bound = 2.0 * ub * norm(mu.data(), d) / norm(diff.data(), d);
        const double truth = norm(&exact.dq[row * d], d);
        const double leak = std::abs(in.scale) * rho * norm(mu.data(), d);
        EXPECT_LE(leak / truth, bound * 1.02) << "seed " << seed << " head " << h << " row " << n;
        double err = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          const double e = fused.plain.dq[row * d + c] - exact.dq[row * d + c];
          err += e * e;
        }
        EXPECT_LE(std::sqrt(err) / truth, (bound + ub) * 1.02) << "seed " << seed << " head " << h << " row " << n;
        smallest_eps = std::min(smallest_eps, r.eps);
        ++rows_checked;
      }
    }
  }
  EXPECT_GT(rows_checked, 3000);
  EXPECT_LT(smallest_eps, 0.01) << "the cases must reach sharp rows";
}

// FlashAttention's path (delta from the saved BF16 output): the row mass is
// the rounding channel plus the saved output's error delta_saved - delta,
// |rho| <= 2 u_b |g_1| + |delta_saved - delta| (1 + 2 u_b), and that
// decomposition is attained (the second channel is what makes two-key row
// mass nonzero: BF16 rounds g_1 and -g_1 symmetrically).
TEST(TwoKeyBound, SavedOutputChannelAddsItsOwnRowMass) {
  constexpr double ub = reference::kBf16UnitRoundoff;
  double tightest = 0.0;
  int64_t nonzero = 0, rows_checked = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const auto in = two_key_inputs(seed);
    const auto saved = reference::forward_fused_bf16(in);
    const auto exact = reference::attention_fp64(in);
    reference::FusedBackwardOptions options;
    options.round_outputs = false;
    const auto fused = reference::backward_fused_bf16(in, saved, options);
    const auto& sh = in.shape;
    const int64_t d = sh.head_dim;
    for (int64_t h = 0; h < sh.q_heads; ++h) {
      for (int64_t n = 0; n < sh.q_len; ++n) {
        const RowTerms r = row_terms(in, exact, h, n);
        if (!well_conditioned(r)) continue;
        const int64_t row = sh.lse_offset(0, h, n);
        double delta_saved = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          delta_saved += static_cast<double>(in.grad_out[row * d + c]) * saved.out[row * d + c];
        }
        const double budget = 2.0 * ub * std::abs(r.g1) + std::abs(delta_saved - r.delta_exact) * (1.0 + 2.0 * ub);
        const double rho = std::abs(static_cast<double>(fused.rows.row_mass[row]));
        EXPECT_LE(rho, budget + fp32_noise(r)) << "seed " << seed << " head " << h << " row " << n;
        if (rho > 0) ++nonzero;
        tightest = std::max(tightest, rho / (budget + fp32_noise(r)));
        ++rows_checked;
      }
    }
  }
  EXPECT_GT(nonzero, rows_checked / 10) << "the saved output's rounding leaves row mass on many rows";
  EXPECT_GT(tightest, 0.5) << "the decomposition is attained up to a small factor";
}

}  // namespace
}  // namespace gaugewatch::testing
