#pragma once
// The docs/numerics.md metrics of one attention call, computed by the reference.
//
// Row mass comes from the emulated fused backward (rho_i, sum_j |t_ij|). Key
// geometry and sharpness use the FP64 probabilities p_ij (with the attn_mask
// bias, if any; masked pairs have p_ij = 0, rows with every key masked are
// left out like rows with no key):
//   mu_k,i = sum_j p_ij k_j,  sigma_k,i = sqrt(sum_j p_ij ||k_j - mu_k,i||^2)
// (centred form: the uncentred one cancels catastrophically when keys share a
// large offset). Discrepancies compare a backend with the FP32 recompute.
// Gauge violation translates every key of a key/value head by b = -bf16(mean
// key), shifts lse by alpha q_i.b exactly as the exact lse shifts, and reruns
// the same backend: ||dQ(K+b) - dQ(K)|| / ||dQ(K)||, 0 in exact arithmetic.

#include <array>

#include "kernels/reference/attention_problem.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/metric_catalogue.h"

namespace gaugewatch::reference {

struct AttentionMetrics {
  std::array<double, kMetricCount> values{};
  double& operator[](MetricId id) { return values[static_cast<std::size_t>(id)]; }
  double operator[](MetricId id) const { return values[static_cast<std::size_t>(id)]; }
};

// `live` names the backend in use ("plain" fused BF16 for the stock kernels).
AttentionMetrics compute_metrics(const AttentionInputs& in, const SavedForward& saved,
                                 const FusedBackward& fused, const Gradients& fp32);

// The conservation-law audit on its own: dQ of the plain fused backward and
// of GProj with every key translated by b (per key/value head).
struct GaugeViolation {
  double plain = 0.0;
  double gproj = 0.0;
  double pivot = 0.0;
};
GaugeViolation gauge_violation(const AttentionInputs& in, const SavedForward& saved,
                               const FusedBackward& fused);

}  // namespace gaugewatch::reference
