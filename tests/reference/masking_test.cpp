// Masking and layout semantics: which keys a row sees under top-left (SDPA)
// and bottom-right (FlashAttention) causal alignment and packing; rows that
// see no key; GQA equal to the same heads expanded to MHA.

#include <gtest/gtest.h>

#include <cmath>

#include "audit/scenarios.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/fused_forward_bf16.h"

namespace gaugewatch::testing {
namespace {

using reference::AttentionInputs;
using reference::CausalMode;
using reference::KeyRange;
using reference::visible_keys;

AttentionInputs shaped(int64_t n, int64_t m, CausalMode causal) {
  AttentionInputs in;
  in.shape = {1, 1, 1, n, m, 4};
  in.causal = causal;
  in.q.assign(n * 4, 0.0f);
  in.grad_out.assign(n * 4, 0.0f);
  in.k.assign(m * 4, 0.0f);
  in.v.assign(m * 4, 0.0f);
  return in;
}

void expect_range(const AttentionInputs& in, int64_t n, int64_t begin, int64_t end) {
  const KeyRange r = visible_keys(in, n);
  EXPECT_EQ(r.begin, begin) << "row " << n;
  EXPECT_EQ(r.end, end) << "row " << n;
}

TEST(Masking, TopLeftIsSdpaIsCausal) {
  auto in = shaped(4, 6, CausalMode::kTopLeft);
  expect_range(in, 0, 0, 1);
  expect_range(in, 3, 0, 4);
  in = shaped(6, 4, CausalMode::kTopLeft);
  expect_range(in, 5, 0, 4);
}

TEST(Masking, BottomRightIsFlashAttentionCausal) {
  auto in = shaped(4, 6, CausalMode::kBottomRight);
  expect_range(in, 0, 0, 3);
  expect_range(in, 3, 0, 6);
  in = shaped(6, 4, CausalMode::kBottomRight);
  expect_range(in, 0, 0, 0);  // sees no key
  expect_range(in, 1, 0, 0);
  expect_range(in, 2, 0, 1);
  expect_range(in, 5, 0, 4);
}

TEST(Masking, PackedSegmentsAreSeparate) {
  auto in = shaped(7, 9, CausalMode::kBottomRight);
  in.cu_seqlens_q = {0, 3, 3, 7};
  in.cu_seqlens_k = {0, 2, 5, 9};
  in.validate();
  expect_range(in, 0, 0, 0);  // segment 0: 3 rows over 2 keys, bottom-right
  expect_range(in, 2, 0, 2);
  expect_range(in, 3, 5, 6);  // segment 2 (segment 1 has no rows)
  expect_range(in, 6, 5, 9);
  in.causal = CausalMode::kNone;
  expect_range(in, 4, 5, 9);
}

TEST(Masking, RowsWithoutKeysGiveZeros) {
  audit::ScenarioSpec spec;
  spec.shape = {1, 2, 2, 40, 16, 64};
  spec.causal = CausalMode::kBottomRight;  // rows 0..23 see nothing
  const auto in = audit::make_inputs(spec);
  const auto saved = reference::forward_fused_bf16(in);
  const auto exact = reference::attention_fp64(in);
  const auto fused = reference::backward_fused_bf16(in, saved);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t n = 0; n < 24; ++n) {
      const int64_t row = in.shape.lse_offset(0, h, n);
      EXPECT_TRUE(std::isinf(saved.lse[row]) && saved.lse[row] > 0);
      EXPECT_TRUE(std::isinf(exact.lse[row]));
      for (int64_t c = 0; c < 64; ++c) {
        EXPECT_EQ(saved.out[row * 64 + c], 0.0f);
        EXPECT_EQ(fused.gproj.dq[row * 64 + c], 0.0f);
        EXPECT_EQ(fused.pivot.dq[row * 64 + c], 0.0f);
      }
      EXPECT_EQ(fused.rows.pivot[row], -1);
    }
  }
}

TEST(Masking, GqaEqualsExpandedHeads) {
  audit::ScenarioSpec spec;
  spec.shape = {2, 6, 2, 33, 47, 64};
  spec.causal = CausalMode::kTopLeft;
  const auto gqa = audit::make_inputs(spec);
  AttentionInputs mha = gqa;
  mha.shape.kv_heads = 6;
  const auto& s = gqa.shape;
  mha.k.resize(mha.shape.kv_elements());
  mha.v.resize(mha.shape.kv_elements());
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.q_heads; ++h) {
      const int64_t from = s.kv_offset(b, h / s.group(), 0), to = mha.shape.kv_offset(b, h, 0);
      std::copy_n(&gqa.k[from], s.kv_len * s.head_dim, &mha.k[to]);
      std::copy_n(&gqa.v[from], s.kv_len * s.head_dim, &mha.v[to]);
    }
  }
  const auto a = reference::attention_fp64(gqa);
  const auto e = reference::attention_fp64(mha);
  for (size_t i = 0; i < a.dq.size(); ++i) ASSERT_NEAR(a.dq[i], e.dq[i], 1e-12) << i;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t hk = 0; hk < s.kv_heads; ++hk) {
      for (int64_t i = 0; i < s.kv_len * s.head_dim; ++i) {
        double dk = 0.0, dv = 0.0;
        for (int64_t g = 0; g < s.group(); ++g) {
          dk += e.dk[mha.shape.kv_offset(b, hk * s.group() + g, 0) + i];
          dv += e.dv[mha.shape.kv_offset(b, hk * s.group() + g, 0) + i];
        }
        ASSERT_NEAR(a.dk[s.kv_offset(b, hk, 0) + i], dk, 1e-11);
        ASSERT_NEAR(a.dv[s.kv_offset(b, hk, 0) + i], dv, 1e-11);
      }
    }
  }
}

TEST(Masking, InvalidInputsAreRejectedWithReasons) {
  auto in = shaped(4, 4, CausalMode::kNone);
  in.shape.q_heads = 3;
  in.shape.kv_heads = 2;
  EXPECT_THROW(in.validate(), std::invalid_argument);
  in = shaped(4, 4, CausalMode::kNone);
  in.cu_seqlens_q = {0, 4};
  EXPECT_THROW(in.validate(), std::invalid_argument);  // needs cu_seqlens_k too
  in.cu_seqlens_k = {0, 3};
  EXPECT_THROW(in.validate(), std::invalid_argument);  // does not end at M
  EXPECT_THROW(reference::parse_causal_mode("diagonal"), std::invalid_argument);
}

}  // namespace
}  // namespace gaugewatch::testing
