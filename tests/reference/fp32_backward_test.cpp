// The FP32 recompute the monitor measures against: within 1e-5 of FP64 on
// well-conditioned inputs; on sink-like inputs its FP32 logits set a floor,
// and centering the keys first (legal: the exact gradients do not move)
// lowers it.

#include <gtest/gtest.h>

#include "audit/scenarios.h"
#include "kernels/reference/errors.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fp32_backward.h"

namespace gaugewatch::testing {
namespace {

using reference::relative_error;

TEST(Fp32Backward, MatchesFp64OnWellConditionedInputs) {
  for (auto causal : {reference::CausalMode::kNone, reference::CausalMode::kTopLeft,
                      reference::CausalMode::kBottomRight}) {
    audit::ScenarioSpec spec;
    spec.shape = {1, 4, 2, 200, 180, 64};
    spec.causal = causal;
    spec.q_segments = {120, 80};
    spec.k_segments = {100, 80};
    const auto in = audit::make_inputs(spec);
    const auto exact = reference::attention_fp64(in);
    for (bool center : {false, true}) {
      const auto g = reference::backward_fp32(in, {center});
      EXPECT_LT(relative_error(g.dq, exact.dq), 1e-5);
      EXPECT_LT(relative_error(g.dk, exact.dk), 1e-5);
      EXPECT_LT(relative_error(g.dv, exact.dv), 1e-5);
    }
  }
}

TEST(Fp32Backward, CenteringKeysLowersTheSinkFloor) {
  audit::ScenarioSpec spec = audit::find_scenario("sink")->spec;
  spec.shape.q_len = spec.shape.kv_len = 512;
  spec.key_offset_rms = 1000.0;
  const auto in = audit::make_inputs(spec);
  const auto exact = reference::attention_fp64(in);
  const auto raw = reference::backward_fp32(in, {false});
  const auto centered = reference::backward_fp32(in, {true});
  const double raw_dq = relative_error(raw.dq, exact.dq);
  const double centered_dq = relative_error(centered.dq, exact.dq);
  RecordProperty("raw_dq", std::to_string(raw_dq));
  RecordProperty("centered_dq", std::to_string(centered_dq));
  EXPECT_LT(centered_dq, raw_dq);
  EXPECT_LT(centered_dq, 1e-3);
}

}  // namespace
}  // namespace gaugewatch::testing
