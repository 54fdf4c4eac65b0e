// Gauge invariance: a common key offset does not change the exact dQ. The
// plain fused BF16 backward's dQ error grows with the offset's norm; GProj's
// stays within 2x of its error on the untranslated keys.

#include <gtest/gtest.h>

#include <cmath>

#include "audit/random_normal.h"
#include "audit/scenarios.h"
#include "kernels/reference/bf16.h"
#include "kernels/reference/errors.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/fused_forward_bf16.h"
#include "kernels/reference/metrics.h"

namespace gaugewatch::testing {
namespace {

struct Errors {
  double plain, gproj, pivot;
};

Errors errors_with_offset(reference::AttentionInputs in, double norm, uint64_t seed) {
  const int64_t d = in.shape.head_dim;
  audit::RandomNormal rng(seed);
  std::vector<double> b(d);
  double length = 0.0;
  for (auto& x : b) {
    x = rng();
    length += x * x;
  }
  for (auto& x : b) x *= norm / std::sqrt(length);
  for (size_t i = 0; i < in.k.size(); ++i) {
    in.k[i] = reference::round_bf16(static_cast<float>(in.k[i] + b[i % d]));
  }
  const auto saved = reference::forward_fused_bf16(in);
  const auto exact = reference::attention_fp64(in);
  const auto fused = reference::backward_fused_bf16(in, saved);
  return {reference::relative_error(fused.plain.dq, exact.dq), reference::relative_error(fused.gproj.dq, exact.dq),
          reference::relative_error(fused.pivot.dq, exact.dq)};
}

TEST(Translation, PlainErrorGrowsGprojStaysPut) {
  audit::ScenarioSpec spec;
  spec.kind = "random";
  spec.shape = {1, 2, 2, 256, 256, 64};
  // Sharp rows, where the leak matters; not so sharp that the kernel's own
  // FP32 logits (alpha q.b grows with the offset) set a floor of their own.
  spec.query_gain = 4.0;
  spec.seed = 7;
  const auto base = audit::make_inputs(spec);
  const Errors unshifted = errors_with_offset(base, 0.0, 1);
  double previous_plain = unshifted.plain;
  for (double norm : {64.0, 1024.0, 16384.0}) {
    const Errors e = errors_with_offset(base, norm, 2);
    SCOPED_TRACE("offset norm " + std::to_string(norm));
    EXPECT_GT(e.plain, previous_plain) << "plain dQ error should grow with the offset";
    EXPECT_LE(e.gproj, 2.0 * unshifted.gproj) << "GProj unshifted " << unshifted.gproj;
    EXPECT_LE(e.pivot, 2.0 * unshifted.pivot) << "pivot unshifted " << unshifted.pivot;
    previous_plain = e.plain;
  }
  EXPECT_GT(previous_plain, 1.0) << "the largest offset should put plain dQ > 100% off";
}

TEST(Translation, GaugeViolationMetricSeparatesBackends) {
  audit::ScenarioSpec spec = audit::find_scenario("sink")->spec;
  spec.shape.q_len = spec.shape.kv_len = 256;
  const auto in = audit::make_inputs(spec);
  const auto saved = reference::forward_fused_bf16(in);
  const auto fused = reference::backward_fused_bf16(in, saved);
  const auto gauge = reference::gauge_violation(in, saved, fused);
  EXPECT_GT(gauge.plain, 0.5);
  EXPECT_LT(gauge.gproj, 0.01);
  EXPECT_LT(gauge.pivot, 0.01);
}

}  // namespace
}  // namespace gaugewatch::testing
