#include "kernels/reference/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/reference/bf16.h"
#include "kernels/reference/errors.h"
#include "kernels/reference/parallel.h"
#include "kernels/reference/vector_math.h"

namespace gaugewatch::reference {

namespace {

using enum MetricId;

// Key geometry of one row under the exact (FP64) probabilities.
struct RowGeometry {
  double offset = 0.0;  // ||mu_k,i||
  double spread = 0.0;  // sigma_k,i
  double p_max = 0.0;
  double logit_abs_max = 0.0;
  bool visible = false;
};

std::vector<RowGeometry> row_geometry(const AttentionInputs& in) {
  const AttentionShape& sh = in.shape;
  const int64_t d = sh.head_dim;
  std::vector<RowGeometry> rows(sh.q_rows());
  parallel_for(sh.batch * sh.q_heads, [&](int64_t bh) {
    const int64_t b = bh / sh.q_heads, h = bh % sh.q_heads, hk = h / sh.group();
    const float* k0 = &in.k[sh.kv_offset(b, hk, 0)];
    std::vector<double> p(sh.kv_len), mu(d), diff(d);
    for (int64_t n = 0; n < sh.q_len; ++n) {
      const KeyRange keys = visible_keys(in, n);
      if (keys.size() == 0 || !sees_a_key(in, b, h, n)) continue;
      const BiasRow bias = in.bias_row(b, h, n);
      const float* q = &in.q[sh.q_offset(b, h, n)];
      RowGeometry& g = rows[sh.lse_offset(b, h, n)];
      g.visible = true;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        p[j] = in.scale * dot<double>(q, k0 + j * d, d) + static_cast<double>(bias[j]);
        mx = std::max(mx, p[j]);
        if (bias.keeps(j)) g.logit_abs_max = std::max(g.logit_abs_max, std::abs(p[j]));
      }
      double l = 0.0;
      for (int64_t j = keys.begin; j < keys.end; ++j) l += (p[j] = std::exp(p[j] - mx));
      std::fill(mu.begin(), mu.end(), 0.0);
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        p[j] /= l;
        g.p_max = std::max(g.p_max, p[j]);
        axpy(p[j], k0 + j * d, mu.data(), d);
      }
      double var = 0.0;  // centred: sum_j p_j ||k_j - mu||^2
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        if (p[j] == 0.0) continue;  // masked out (and no weight either way)
        const float* kj = k0 + j * d;
        double sq = 0.0;
        for (int64_t c = 0; c < d; ++c) {
          const double x = static_cast<double>(kj[c]) - mu[c];
          sq += x * x;
        }
        var += p[j] * sq;
      }
      g.offset = std::sqrt(dot<double>(mu.data(), mu.data(), d));
      g.spread = std::sqrt(var);
    }
  });
  return rows;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  const auto mid = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), mid, values.end());
  if (values.size() % 2 == 1) return *mid;
  const double upper = *mid;
  const double lower = *std::max_element(values.begin(), mid);
  return 0.5 * (lower + upper);
}

double max_of(const std::vector<double>& values) {
  return values.empty() ? 0.0 : *std::max_element(values.begin(), values.end());
}

double mean_of(const std::vector<double>& values) {
  if (values.empty()) return 0.0;
  long double sum = 0;
  for (double v : values) sum += v;
  return static_cast<double>(sum / static_cast<long double>(values.size()));
}

}  // namespace

GaugeViolation gauge_violation(const AttentionInputs& in, const SavedForward& saved,
                               const FusedBackward& fused) {
  const AttentionShape& sh = in.shape;
  const int64_t d = sh.head_dim;
  AttentionInputs shifted = in;
  SavedForward shifted_saved = saved;
  std::vector<double> mean(d);
  std::vector<float> shift(d);
  for (int64_t b = 0; b < sh.batch; ++b) {
    for (int64_t hk = 0; hk < sh.kv_heads; ++hk) {
      // b = -bf16(mean key): a common translation of this head's keys, which
      // the kernel must receive as BF16 again.
      std::fill(mean.begin(), mean.end(), 0.0);
      const float* k0 = &in.k[sh.kv_offset(b, hk, 0)];
      for (int64_t j = 0; j < sh.kv_len; ++j) axpy(1.0, k0 + j * d, mean.data(), d);
      for (int64_t c = 0; c < d; ++c) {
        shift[c] = -round_bf16(static_cast<float>(mean[c] / static_cast<double>(sh.kv_len)));
      }
      float* k1 = &shifted.k[sh.kv_offset(b, hk, 0)];
      for (int64_t j = 0; j < sh.kv_len; ++j) {
        for (int64_t c = 0; c < d; ++c) k1[j * d + c] = round_bf16(k0[j * d + c] + shift[c]);
      }
      // The exact lse moves by alpha q_i.b; the saved output does not move.
      for (int64_t h = hk * sh.group(); h < (hk + 1) * sh.group(); ++h) {
        for (int64_t n = 0; n < sh.q_len; ++n) {
          float& lse = shifted_saved.lse[sh.lse_offset(b, h, n)];
          if (!std::isfinite(lse)) continue;
          const double moved = static_cast<double>(lse) +
                               in.scale * dot<double>(&in.q[sh.q_offset(b, h, n)], shift.data(), d);
          lse = static_cast<float>(moved);
        }
      }
    }
  }
  const FusedBackward translated = backward_fused_bf16(shifted, shifted_saved);
  return GaugeViolation{relative_error(translated.plain.dq, fused.plain.dq),
                        relative_error(translated.gproj.dq, fused.gproj.dq),
                        relative_error(translated.pivot.dq, fused.pivot.dq)};
}

AttentionMetrics compute_metrics(const AttentionInputs& in, const SavedForward& saved,
                                 const FusedBackward& fused, const Gradients& fp32) {
  AttentionMetrics m;
  const AttentionShape& sh = in.shape;
  const std::vector<RowGeometry> geometry = row_geometry(in);

  std::vector<double> mass, normalized, offsets, spreads, ratios;
  double sharp = 0.0, visible = 0.0, logit_max = 0.0;
  for (int64_t i = 0; i < sh.q_rows(); ++i) {
    const RowGeometry& g = geometry[i];
    if (!g.visible) continue;
    visible += 1.0;
    const double rho = std::abs(static_cast<double>(fused.rows.row_mass[i]));
    const double abs_mass = fused.rows.abs_row_mass[i];
    mass.push_back(rho);
    offsets.push_back(g.offset);
    spreads.push_back(g.spread);
    // A row on a single key (one visible key, or all of p on one) has no
    // spread: its ratio is unbounded, and its t is 0 in exact arithmetic, so
    // |rho| / sum |t| is 0/0 that rounding noise makes 0 or 1. Both skip it.
    if (g.spread > 0.0) {
      ratios.push_back(g.offset / g.spread);
      normalized.push_back(abs_mass > 0.0 ? rho / abs_mass : 0.0);
    }
    if (g.p_max > 0.999) sharp += 1.0;
    logit_max = std::max(logit_max, g.logit_abs_max);
  }
  m[kRowMassAbsMax] = max_of(mass);
  m[kRowMassAbsMean] = mean_of(mass);
  m[kRowMassNormalizedMax] = max_of(normalized);
  m[kRowMassNormalizedMean] = mean_of(normalized);
  m[kKeyOffsetMedian] = median(offsets);
  m[kKeyOffsetMax] = max_of(offsets);
  m[kKeySpreadMedian] = median(spreads);
  m[kKeyOffsetSpreadRatioMedian] = median(ratios);
  m[kKeyOffsetSpreadRatioMax] = max_of(ratios);
  long double key_sq = 0;
  for (float x : in.k) key_sq += static_cast<long double>(x) * x;
  const auto keys = static_cast<long double>(sh.batch * sh.kv_heads * sh.kv_len);
  m[kKeyRms] = static_cast<double>(std::sqrt(key_sq / keys));
  m[kSharpRowFraction] = visible > 0.0 ? sharp / visible : 0.0;
  m[kLogitAbsMax] = logit_max;
  m[kLiveDqDiscrepancy] = relative_error(fused.plain.dq, fp32.dq);
  m[kLiveDkDiscrepancy] = relative_error(fused.plain.dk, fp32.dk);
  m[kLiveDvDiscrepancy] = relative_error(fused.plain.dv, fp32.dv);
  m[kGprojDqDiscrepancy] = relative_error(fused.gproj.dq, fp32.dq);
  m[kGprojDkDiscrepancy] = relative_error(fused.gproj.dk, fp32.dk);
  m[kGprojDvDiscrepancy] = relative_error(fused.gproj.dv, fp32.dv);
  const GaugeViolation gauge = gauge_violation(in, saved, fused);
  m[kLiveGaugeViolation] = gauge.plain;
  m[kGprojGaugeViolation] = gauge.gproj;
  return m;
}

}  // namespace gaugewatch::reference
