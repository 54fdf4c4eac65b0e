// The auditor (hooks/auditor.cpp) fed directly, on the CPU, with the operand
// layouts the CUDA ops produce: the real stock CPU flash forward / backward
// give q, k, v, out, lse, dq, dk, dv, and the same call is audited with the
// log-sum-exp as the CPU / CUDA flash ops return it (B, H, N), as cuDNN does
// (B, H, N, 1) and as efficient attention does (B, H, 32 * ceil(N / 32),
// padded). Each must give a sample, and the same metrics; a layout that is
// none of these is skipped and counted by reason. Also: live_gauge_violation
// is forwarded for the backend that ran.
//
// The library is linked, so the interceptor is registered; main() sets
// GAUGEWATCH_SOCKET=none and GAUGEWATCH_SAMPLE_EVERY=0 (no agent, no samples
// of the sampler's own) and re-executes the binary: the library reads its
// configuration when it is loaded, before main.

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unistd.h>

#include "hooks/auditor.h"
#include "hooks/gaugewatch_hooks.h"

namespace gaugewatch::hooks {
namespace {

using nlohmann::json;

json stats() { return json::parse(stats_json()); }

// Waits until the auditor submitted `count` samples in all.
json wait_for_samples(std::uint64_t count) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  json s = stats();
  while (s["samples_submitted"].get<std::uint64_t>() < count && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    s = stats();
  }
  return s;
}

struct StockCall {
  at::Tensor q, k, v, out, lse, grad_out, dq, dk, dv;
};

// One causal BF16 call, B=1, H=2, N=M=16, d=8, through the stock CPU flash op.
StockCall stock_call() {
  at::manual_seed(0);
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  StockCall c;
  c.q = at::randn({1, 2, 16, 8}, bf16);
  c.k = (at::randn({1, 2, 16, 8}) + 3.0).to(at::kBFloat16);  // a common key offset: a visible gauge violation
  c.v = at::randn({1, 2, 16, 8}, bf16);
  const at::AutoDispatchBelowADInplaceOrView below;  // the stock kernels, not the interceptor
  std::tie(c.out, c.lse) = at::_ops::_scaled_dot_product_flash_attention_for_cpu::call(
      c.q, c.k, c.v, 0.0, true, std::nullopt, std::nullopt);
  c.grad_out = at::randn({1, 2, 16, 8}, bf16);
  std::tie(c.dq, c.dk, c.dv) = at::_ops::_scaled_dot_product_flash_attention_for_cpu_backward::call(
      c.grad_out, c.q, c.k, c.v, c.out, c.lse, 0.0, true, std::nullopt, std::nullopt);
  return c;
}

AuditCall audit_of(const StockCall& c, const at::Tensor& lse) {
  AuditCall call;
  call.grad_out = c.grad_out;
  call.q = c.q;
  call.k = c.k;
  call.v = c.v;
  call.out = c.out;
  call.lse = lse;
  call.dq = c.dq;
  call.dk = c.dk;
  call.dv = c.dv;
  call.is_causal = true;
  call.op = "audit_test";
  return call;
}

BackwardPlan sample_plan(std::int64_t layer) {
  BackwardPlan plan;
  plan.layer = layer;
  plan.step = 4;
  plan.sample = true;
  plan.max_heads = 2;
  plan.max_rows = 16;
  return plan;
}

// Three real layers in the runtime (attn.0..2): three intercepted SDPA calls
// and their backward (the sampler is off: GAUGEWATCH_SAMPLE_EVERY=0).
void make_three_layers() {
  const at::AutoGradMode grad(true);
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  at::Tensor x = at::randn({1, 2, 16, 8}, bf16).requires_grad_(true);
  at::Tensor y = x;
  for (int l = 0; l < 3; ++l) y = at::scaled_dot_product_attention(y, y, y, {}, 0.0, true);
  y.sum().backward();
}

TEST(CanonicalLse, TakesEveryOpsLayoutToBHN) {
  const at::Tensor lse = at::randn({2, 3, 5});
  EXPECT_TRUE(canonical_lse(lse, 5).equal(lse));
  const at::Tensor cudnn = lse.unsqueeze(-1);  // (B, H, N, 1)
  const at::Tensor from_cudnn = canonical_lse(cudnn, 5);
  EXPECT_EQ(from_cudnn.sizes(), lse.sizes());
  EXPECT_TRUE(from_cudnn.equal(lse));
  EXPECT_EQ(from_cudnn.data_ptr(), cudnn.data_ptr());  // a view, no copy
  const at::Tensor padded = at::full({2, 3, 32}, std::numeric_limits<float>::quiet_NaN());
  padded.narrow(2, 0, 5).copy_(lse);
  const at::Tensor from_padded = canonical_lse(padded, 5);
  EXPECT_EQ(from_padded.sizes(), lse.sizes());
  EXPECT_TRUE(from_padded.equal(lse));
  // Not a log-sum-exp layout: unchanged, for the caller to refuse.
  EXPECT_EQ(canonical_lse(lse.unsqueeze(-1).expand({2, 3, 5, 2}), 5).dim(), 4);
  EXPECT_EQ(canonical_lse(lse, 9).size(2), 5);
}

TEST(Audit, CudnnAndEfficientLseLayoutsGiveTheSameSampleAsFlash) {
  make_three_layers();
  json s = stats();
  ASSERT_EQ(s["layers"].size(), 3u) << s.dump();
  ASSERT_EQ(s["samples_submitted"], 0) << s.dump();

  const StockCall c = stock_call();
  ASSERT_EQ(c.lse.dim(), 3);
  at::Tensor padded = at::full({1, 2, 32}, std::numeric_limits<float>::quiet_NaN());
  padded.narrow(2, 0, 16).copy_(c.lse);
  audit_call(audit_of(c, c.lse), sample_plan(0), Backend::kStock, 1.0);               // flash
  audit_call(audit_of(c, c.lse.unsqueeze(-1)), sample_plan(1), Backend::kStock, 1.0);  // cuDNN
  audit_call(audit_of(c, padded), sample_plan(2), Backend::kStock, 1.0);               // efficient
  // Not a log-sum-exp: skipped, with its reason.
  audit_call(audit_of(c, c.lse.unsqueeze(-1).expand({1, 2, 16, 2})), sample_plan(0), Backend::kStock, 1.0);

  s = wait_for_samples(3);
  ASSERT_EQ(s["samples_submitted"], 3) << s.dump();
  EXPECT_EQ(s["audits_skipped_other"], 1) << s.dump();
  EXPECT_EQ(s["audits_skipped_reasons"], (json{{"unsupported operand layout", 1}})) << s.dump();
  const json flash = s["layers"][0]["latest"];
  ASSERT_EQ(flash["step"], 4) << s.dump();
  for (const char* name : {"live_dq_discrepancy", "live_dk_discrepancy", "live_dv_discrepancy", "key_rms",
                           "live_gauge_violation", "gproj_gauge_violation"}) {
    ASSERT_TRUE(flash.contains(name)) << name << ": " << flash.dump();
  }
  EXPECT_GT(flash["live_gauge_violation"].get<double>(), 0.0) << flash.dump();
  EXPECT_TRUE(std::isfinite(flash["live_gauge_violation"].get<double>()));
  EXPECT_EQ(s["layers"][1]["latest"], flash) << "cuDNN layout";
  EXPECT_EQ(s["layers"][2]["latest"], flash) << "efficient (padded) layout";
}

TEST(Audit, LiveGaugeViolationIsTheBackendThatRan) {
  const std::uint64_t before = stats()["samples_submitted"].get<std::uint64_t>();
  const StockCall c = stock_call();
  if (stats()["layers"].empty()) make_three_layers();
  // The same operands reported as run by gproj (layer 0) and by fp32 (layer 1).
  audit_call(audit_of(c, c.lse), sample_plan(0), Backend::kGproj, 1.0);
  audit_call(audit_of(c, c.lse), sample_plan(1), Backend::kFp32, 1.0);
  const json s = wait_for_samples(before + 2);
  ASSERT_EQ(s["samples_submitted"], before + 2) << s.dump();
  const json gproj = s["layers"][0]["latest"];
  ASSERT_TRUE(gproj.contains("live_gauge_violation")) << gproj.dump();
  EXPECT_EQ(gproj["live_gauge_violation"], gproj["gproj_gauge_violation"]) << gproj.dump();
  // No translation audit of the fp32 backward in the op: left unset, not borrowed from stock.
  const json fp32 = s["layers"][1]["latest"];
  EXPECT_TRUE(fp32.contains("live_dq_discrepancy")) << fp32.dump();
  EXPECT_FALSE(fp32.contains("live_gauge_violation")) << fp32.dump();
}

TEST(Audit, NonFiniteOperandsSkipTheSampleNeverCrash) {
  if (stats()["layers"].empty()) make_three_layers();
  const std::uint64_t before = stats()["samples_submitted"].get<std::uint64_t>();
  const std::uint64_t skipped = stats()["audits_skipped_other"].get<std::uint64_t>();
  // NaN in q, through the real stock op: out, lse and the gradients of the
  // row carry it; Inf in a key; and a clean call after them still audits.
  StockCall nan_q = stock_call();
  nan_q.q.index_put_({0, 1, 15, 3}, std::numeric_limits<float>::quiet_NaN());
  {
    const at::AutoDispatchBelowADInplaceOrView below;
    std::tie(nan_q.out, nan_q.lse) = at::_ops::_scaled_dot_product_flash_attention_for_cpu::call(
        nan_q.q, nan_q.k, nan_q.v, 0.0, true, std::nullopt, std::nullopt);
  }
  StockCall inf_k = stock_call();
  inf_k.k.index_put_({0, 0, 2, 0}, std::numeric_limits<float>::infinity());
  audit_call(audit_of(nan_q, nan_q.lse), sample_plan(0), Backend::kStock, 1.0);
  audit_call(audit_of(inf_k, inf_k.lse), sample_plan(1), Backend::kStock, 1.0);
  const StockCall clean = stock_call();
  audit_call(audit_of(clean, clean.lse), sample_plan(2), Backend::kStock, 1.0);
  const json s = wait_for_samples(before + 1);
  // The auditor thread handles them in order: once the clean one is in, the other two were skipped.
  EXPECT_EQ(s["samples_submitted"], before + 1) << s.dump();
  EXPECT_EQ(s["audits_skipped_other"], skipped + 2) << s.dump();
  EXPECT_EQ(s["audits_skipped_reasons"]["non-finite operands (NaN/Inf)"], 2) << s.dump();
  EXPECT_EQ(s["layers"][2]["latest"]["step"], 4) << s.dump();
}

}  // namespace
}  // namespace gaugewatch::hooks

int main(int argc, char** argv) {
  const char* socket = std::getenv("GAUGEWATCH_SOCKET");
  if (socket == nullptr || std::string(socket) != "none") {
    ::setenv("GAUGEWATCH_SOCKET", "none", 1);
    ::setenv("GAUGEWATCH_SAMPLE_EVERY", "0", 1);
    ::setenv("GAUGEWATCH_RUN_ID", "audit-test", 1);
    ::unsetenv("GAUGEWATCH_STATS_FILE");
    ::unsetenv("GAUGEWATCH_LAYER_BACKENDS");
    ::unsetenv("GAUGEWATCH_BACKEND");
    ::execv("/proc/self/exe", argv);
    std::perror("execv /proc/self/exe");
    return 2;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
