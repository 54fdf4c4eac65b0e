#include "kernels/reference/metric_catalogue.h"

#include <stdexcept>

namespace gaugewatch::reference {

namespace {

using enum MetricId;

// Order matches MetricId; metric_catalogue() checks it once.
constexpr std::array<MetricSpec, kMetricCount> kCatalogue{{
    {kRowMassAbsMax, "row_mass_abs_max", "ratio",
     "Largest |rho_i| = |sum_j t_ij| over rows: the BF16 score gradient's leftover row sum."},
    {kRowMassAbsMean, "row_mass_abs_mean", "ratio", "Mean |rho_i| over rows with a visible key."},
    {kRowMassNormalizedMax, "row_mass_normalized_max", "ratio",
     "Largest |rho_i| / sum_j |t_ij|: row mass relative to the row's gradient size (rows with key spread; "
     "a row on one key has t = 0 exactly, its ratio is rounding noise)."},
    {kRowMassNormalizedMean, "row_mass_normalized_mean", "ratio",
     "Mean |rho_i| / sum_j |t_ij| over rows with key spread (more than one key carrying probability)."},
    {kKeyOffsetMedian, "key_offset_median", "norm",
     "Median over rows of ||mu_k,i||, the attention-weighted mean key the row mass multiplies."},
    {kKeyOffsetMax, "key_offset_max", "norm", "Largest ||mu_k,i|| over rows."},
    {kKeySpreadMedian, "key_spread_median", "norm",
     "Median over rows of sigma_k,i = sqrt(sum_j p_ij ||k_j - mu_k,i||^2)."},
    {kKeyOffsetSpreadRatioMedian, "key_offset_spread_ratio_median", "ratio",
     "Median over rows of ||mu_k,i|| / sigma_k,i: the leak amplification."},
    {kKeyOffsetSpreadRatioMax, "key_offset_spread_ratio_max", "ratio",
     "Largest ||mu_k,i|| / sigma_k,i over rows."},
    {kKeyRms, "key_rms", "norm", "Root mean square key norm over the sequence."},
    {kSharpRowFraction, "sharp_row_fraction", "ratio",
     "Fraction of rows whose largest attention probability exceeds 0.999."},
    {kLogitAbsMax, "logit_abs_max", "logit", "Largest |s_ij| = |alpha q_i.k_j| over visible pairs."},
    {kLiveDqDiscrepancy, "live_dq_discrepancy", "ratio",
     "||dQ_live - dQ_fp32|| / ||dQ_fp32|| for the backend in use."},
    {kLiveDkDiscrepancy, "live_dk_discrepancy", "ratio",
     "||dK_live - dK_fp32|| / ||dK_fp32|| for the backend in use."},
    {kLiveDvDiscrepancy, "live_dv_discrepancy", "ratio",
     "||dV_live - dV_fp32|| / ||dV_fp32|| for the backend in use."},
    {kGprojDqDiscrepancy, "gproj_dq_discrepancy", "ratio",
     "||dQ_gproj - dQ_fp32|| / ||dQ_fp32||."},
    {kGprojDkDiscrepancy, "gproj_dk_discrepancy", "ratio",
     "||dK_gproj - dK_fp32|| / ||dK_fp32||."},
    {kGprojDvDiscrepancy, "gproj_dv_discrepancy", "ratio",
     "||dV_gproj - dV_fp32|| / ||dV_fp32||."},
    {kLiveGaugeViolation, "live_gauge_violation", "ratio",
     "||dQ(K+b) - dQ(K)|| / ||dQ(K)|| for the backend in use, b = -mean key: 0 in exact arithmetic."},
    {kGprojGaugeViolation, "gproj_gauge_violation", "ratio",
     "The same translation audit for GProj."},
}};

}  // namespace

const std::array<MetricSpec, kMetricCount>& metric_catalogue() {
  static const bool ordered = [] {
    for (std::size_t i = 0; i < kMetricCount; ++i) {
      if (static_cast<std::size_t>(kCatalogue[i].id) != i) {
        throw std::logic_error("metric catalogue out of MetricId order");
      }
    }
    return true;
  }();
  (void)ordered;
  return kCatalogue;
}

const MetricSpec& metric_spec(MetricId id) {
  return metric_catalogue().at(static_cast<std::size_t>(id));
}

}  // namespace gaugewatch::reference
