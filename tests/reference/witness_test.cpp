// The four-key witness of docs/numerics.md: every input and the saved output are
// exactly representable, attention is uniform, the true dq[0] is exactly 0;
// the plain fused BF16 backward returns -24 there, GProj and pivot 0.

#include <gtest/gtest.h>

#include <cmath>

#include "audit/scenarios.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/fused_forward_bf16.h"

namespace gaugewatch::testing {
namespace {

TEST(FourKeyWitness, PlainGivesMinus24ProjectionsGiveZero) {
  const auto in = audit::four_key_witness();
  const auto saved = reference::forward_fused_bf16(in);
  for (float o : saved.out) ASSERT_EQ(o, 0.0f) << "the saved output of the witness is exactly 0";
  const auto exact = reference::attention_fp64(in);
  const auto fused = reference::backward_fused_bf16(in, saved);

  EXPECT_EQ(exact.dq[0], 0.0);
  EXPECT_EQ(fused.plain.dq[0], -24.0f);
  EXPECT_LT(std::abs(fused.gproj.dq[0]), 1e-3f);
  EXPECT_LT(std::abs(fused.pivot.dq[0]), 1e-3f);
  EXPECT_FLOAT_EQ(fused.rows.row_mass[0], -3.0f / 1024.0f);
  EXPECT_FLOAT_EQ(fused.rows.prob_mass[0], 1.0f);
}

TEST(FourKeyWitness, NoForwardRepairHelps) {
  // The forward is already exact here: delta from P dP instead of the saved
  // output leaves the -24 untouched; the leak is the rounding of dS itself.
  const auto in = audit::four_key_witness();
  const auto saved = reference::forward_fused_bf16(in);
  reference::FusedBackwardOptions options;
  options.delta_source = reference::DeltaSource::kProbabilities;
  const auto fused = reference::backward_fused_bf16(in, saved, options);
  EXPECT_EQ(fused.plain.dq[0], -24.0f);
  EXPECT_LT(std::abs(fused.gproj.dq[0]), 1e-3f);
}

}  // namespace
}  // namespace gaugewatch::testing
