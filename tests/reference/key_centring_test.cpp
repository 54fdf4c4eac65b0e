// Key centring (kernels/reference/key_centring.h): the choice of kbar per
// coordinate, exactness of K - kbar where the offset dominates, the lse
// shift, gauge invariance of the truth, and the "center" backend's accuracy:
// the witness repaired exactly, sink-like inputs to the percent level, random
// inputs untouched by "auto" (and made worse by "always", which is why auto
// skips them).

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "audit/scenarios.h"
#include "kernels/reference/bf16.h"
#include "kernels/reference/errors.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/fused_forward_bf16.h"
#include "kernels/reference/key_centring.h"

namespace gaugewatch::testing {
namespace {

using reference::CentringPolicy;
using reference::round_bf16;

reference::AttentionInputs scenario(const std::string& kind, double key_offset, double gain, uint64_t seed,
                                    reference::AttentionShape shape = {1, 2, 2, 256, 256, 64}) {
  audit::ScenarioSpec spec;
  spec.kind = kind;
  spec.shape = shape;
  spec.key_offset_rms = key_offset;
  spec.query_gain = gain;
  spec.seed = seed;
  return audit::make_inputs(spec);
}

TEST(KeyCentring, KbarCentresOnlyCoordinatesWhoseOffsetDominates) {
  // 4 coordinates: offset 1000 (centred), none, 3 spreads (centred), 1.5 spreads (kept).
  const int64_t m = 64, d = 4;
  std::vector<float> keys(m * d);
  for (int64_t j = 0; j < m; ++j) {
    const float unit = (j % 2 == 0 ? 1.0f : -1.0f);  // mean 0, RMS deviation exactly 1
    keys[j * d + 0] = 1000.0f + unit;
    keys[j * d + 1] = unit;
    keys[j * d + 2] = 3.0f + unit;
    keys[j * d + 3] = 1.5f + unit;
  }
  float kbar[4];
  reference::choose_kbar(keys.data(), m, d, CentringPolicy::kAuto, &round_bf16, kbar);
  EXPECT_EQ(kbar[0], 1000.0f);
  EXPECT_EQ(kbar[1], 0.0f);
  EXPECT_EQ(kbar[2], 3.0f);
  EXPECT_EQ(kbar[3], 0.0f);
  reference::choose_kbar(keys.data(), m, d, CentringPolicy::kAlways, &round_bf16, kbar);
  EXPECT_EQ(kbar[3], 1.5f);
  EXPECT_EQ(kbar[1], 0.0f);  // the mean itself is 0
  reference::choose_kbar(keys.data(), m, d, CentringPolicy::kNever, &round_bf16, kbar);
  for (float x : kbar) EXPECT_EQ(x, 0.0f);
}

TEST(KeyCentring, KbarIsOnTheGrid) {
  const int64_t m = 3, d = 1;
  const std::vector<float> keys{1000.0f, 1004.0f, 1008.0f};  // mean 1004 is not a BF16 value
  float kbar[1];
  reference::choose_kbar(keys.data(), m, d, CentringPolicy::kAlways, &round_bf16, kbar);
  EXPECT_TRUE(reference::is_bf16_exact(kbar[0]));
  EXPECT_EQ(kbar[0], round_bf16(1004.0f));
}

TEST(KeyCentring, CentredKeysAreExactAndTheTruthIsUnchanged) {
  const auto in = scenario("sink", 200.0, 20.0, 3);
  const auto saved = reference::forward_fused_bf16(in);
  const auto centred = reference::centre_keys(in, saved, CentringPolicy::kAuto);
  const auto& s = in.shape;
  const int64_t d = s.head_dim;
  int64_t centred_coordinates = 0, exact = 0, checked = 0, centred_entries = 0, exact_entries = 0;
  for (int64_t pair = 0; pair < s.batch * s.kv_heads; ++pair) {
    for (int64_t c = 0; c < d; ++c) {
      const float kbar = centred.kbar[pair * d + c];
      if (kbar == 0.0f) continue;
      ++centred_coordinates;
      for (int64_t j = 0; j < s.kv_len; ++j) {
        const int64_t i = (pair * s.kv_len + j) * d + c;
        const float diff = in.k[i] - kbar;  // exact in float
        ++centred_entries;
        exact_entries += centred.k[i] == diff;
        // Sterbenz: k within a factor 2 of kbar subtracts exactly in BF16.
        if (std::abs(diff) <= std::abs(kbar) / 2) {
          ++checked;
          exact += centred.k[i] == diff;
        }
      }
    }
  }
  EXPECT_GT(centred_coordinates, (s.batch * s.kv_heads * d) * 9 / 10) << "offset RMS 200 dominates most coordinates";
  EXPECT_EQ(exact, checked);
  EXPECT_GT(checked, 0);
  RecordProperty("exact_fraction", std::to_string(double(exact_entries) / double(centred_entries)));
  EXPECT_GT(exact_entries, centred_entries * 99 / 100) << "K - kbar is exact almost everywhere it is centred";

  // Gauge invariance: the exact gradients of the translated problem (K - kbar
  // unrounded) are those of the original, and its lse is the shifted lse.
  reference::AttentionInputs shifted = in;
  for (int64_t pair = 0; pair < s.batch * s.kv_heads; ++pair) {
    for (int64_t j = 0; j < s.kv_len; ++j) {
      for (int64_t c = 0; c < d; ++c) shifted.k[(pair * s.kv_len + j) * d + c] -= centred.kbar[pair * d + c];
    }
  }
  const auto truth = reference::attention_fp64(in);
  const auto moved = reference::attention_fp64(shifted);
  EXPECT_LT(reference::relative_error(moved.dq, truth.dq), 1e-9);
  EXPECT_LT(reference::relative_error(moved.dk, truth.dk), 1e-9);
  // lse moves by alpha q.kbar: the shifted saved lse is the centred problem's.
  double worst = 0.0;
  for (size_t i = 0; i < centred.lse.size(); ++i) {
    worst = std::max(worst, std::abs(centred.lse[i] - moved.lse[i]) / std::max(1.0, std::abs(truth.lse[i])));
  }
  EXPECT_LT(worst, 1e-5);
}

TEST(KeyCentring, RepairsTheFourKeyWitnessExactly) {
  const auto in = audit::four_key_witness();
  const auto saved = reference::forward_fused_bf16(in);
  EXPECT_EQ(reference::backward_fused_bf16(in, saved).plain.dq[0], -24.0f);
  EXPECT_EQ(reference::backward_center_bf16(in, saved).dq[0], 0.0f);
}

TEST(KeyCentring, SinkLikeToPercentLevelRandomUntouched) {
  struct Case {
    const char* name;
    double key_offset, gain;
    bool sink;
  };
  for (const Case& c : {Case{"sink_offset250_gain25", 250.0, 25.0, true},
                        Case{"sink_offset2000_gain8", 2000.0, 8.0, true}, Case{"random", 0.0, 1.0, false}}) {
    SCOPED_TRACE(c.name);
    const auto in = scenario(c.sink ? "sink" : "random", c.key_offset, c.gain, 5);
    const auto saved = reference::forward_fused_bf16(in);
    const auto truth = reference::attention_fp64(in);
    const auto plain = reference::backward_fused_bf16(in, saved).plain;
    const auto center = reference::backward_center_bf16(in, saved);
    const double plain_dq = reference::relative_error(plain.dq, truth.dq);
    const double center_dq = reference::relative_error(center.dq, truth.dq);
    RecordProperty(std::string(c.name) + "_plain_dq", std::to_string(plain_dq));
    RecordProperty(std::string(c.name) + "_center_dq", std::to_string(center_dq));
    if (c.sink) {
      EXPECT_GT(plain_dq, 0.5);
      EXPECT_LT(center_dq, 0.02);
      EXPECT_LT(reference::relative_error(center.dk, truth.dk), 0.02);
    } else {
      EXPECT_EQ(center.dq, plain.dq) << "auto leaves keys without an offset alone";
      const auto always = reference::backward_center_bf16(in, saved, CentringPolicy::kAlways);
      EXPECT_GT(reference::relative_error(always.dq, truth.dq), plain_dq)
          << "centring keys without an offset only adds rounding";
    }
  }
}

TEST(KeyCentring, PolicyNamesRoundTrip) {
  for (auto p : {CentringPolicy::kAuto, CentringPolicy::kAlways, CentringPolicy::kNever}) {
    EXPECT_EQ(reference::parse_centring_policy(reference::to_string(p)), p);
  }
  EXPECT_THROW(reference::parse_centring_policy("sometimes"), std::invalid_argument);
}

}  // namespace
}  // namespace gaugewatch::testing
