// The conservation law: the exact score gradient sums to zero along every
// row, and a projection leaves a gradient that BF16 represents exactly (so
// t = g, row mass 0) unchanged, bit for bit.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "audit/scenarios.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/fused_forward_bf16.h"

namespace gaugewatch::testing {
namespace {

TEST(Conservation, ExactScoreGradientRowsSumToZero) {
  for (const char* name : {"random", "sink", "massive_key", "clusters"}) {
    audit::ScenarioSpec spec = audit::find_scenario(name)->spec;
    spec.shape.q_len = spec.shape.kv_len = 192;
    const auto exact = reference::attention_fp64(audit::make_inputs(spec));
    EXPECT_LT(exact.max_relative_row_sum, 1e-12) << name;
  }
}

// q = 0 gives uniform attention p = 1/4 over four keys; with dO = e_0 and
// v_j[0] = a_j (mean 0) the saved output is exactly 0, delta = 0 and
// g_j = a_j / 4: exactly representable, summing to zero.
reference::AttentionInputs representable_gradient_inputs() {
  reference::AttentionInputs in;
  const int64_t d = 64, rows = 3;
  in.shape = {1, rows, rows, 1, 4, d};
  in.scale = 0.125;
  in.q.assign(rows * d, 0.0f);
  in.grad_out.assign(rows * d, 0.0f);
  in.k.assign(rows * 4 * d, 0.0f);
  in.v.assign(rows * 4 * d, 0.0f);
  const float patterns[rows][4] = {{4, -4, 0, 0}, {8, -4, -4, 0}, {12, -4, -4, -4}};
  for (int64_t h = 0; h < rows; ++h) {
    in.grad_out[h * d] = 1.0f;
    for (int64_t j = 0; j < 4; ++j) {
      in.v[(h * 4 + j) * d] = patterns[h][j];
      for (int64_t c = 0; c < d; ++c) {
        // Keys with a large common offset and distinct small parts: the
        // regime where any row mass would show.
        in.k[(h * 4 + j) * d + c] = 4096.0f + static_cast<float>((j * 7 + c * 3) % 11);
      }
    }
  }
  return in;
}

TEST(Conservation, ProjectionLeavesRepresentableGradientUnchanged) {
  const auto in = representable_gradient_inputs();
  const auto saved = reference::forward_fused_bf16(in);
  const auto fused = reference::backward_fused_bf16(in, saved);
  const auto exact = reference::attention_fp64(in);
  for (float rho : fused.rows.row_mass) EXPECT_EQ(rho, 0.0f);
  EXPECT_EQ(fused.gproj.dq, fused.plain.dq);
  EXPECT_EQ(fused.gproj.dk, fused.plain.dk);
  EXPECT_EQ(fused.pivot.dq, fused.plain.dq);
  EXPECT_EQ(fused.pivot.dk, fused.plain.dk);
  // And that gradient is the exact one (up to the final BF16 rounding).
  for (size_t i = 0; i < exact.dq.size(); ++i) {
    EXPECT_NEAR(fused.plain.dq[i], exact.dq[i], std::abs(exact.dq[i]) * (1.0 / 256) + 1e-6) << i;
  }
}

// NaN operands give NaN gradients, never a write outside the tensors: a row
// whose every P is NaN has no pivot, and its fix-up is skipped (regression:
// the pivot index -1 used to be dereferenced).
TEST(Conservation, NanQueryRowHasNoPivotAndStaysInBounds) {
  audit::ScenarioSpec spec = audit::find_scenario("random")->spec;
  spec.shape.q_len = spec.shape.kv_len = 16;
  auto in = audit::make_inputs(spec);
  const auto saved = reference::forward_fused_bf16(in);
  in.q[3 * in.shape.head_dim] = std::numeric_limits<float>::quiet_NaN();
  const auto fused = reference::backward_fused_bf16(in, saved);
  EXPECT_EQ(fused.rows.pivot[3], -1);
  EXPECT_TRUE(std::isnan(fused.pivot.dq[3 * in.shape.head_dim]));
  EXPECT_TRUE(std::isnan(fused.gproj.dq[3 * in.shape.head_dim]));
}

}  // namespace
}  // namespace gaugewatch::testing
