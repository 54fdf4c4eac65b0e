#include "agent/server/message_validator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "agent/state/metric_fields.h"

namespace gaugewatch::agent {
namespace {

namespace v1 = gaugewatch::v1;

v1::Hello good_hello() {
  v1::Hello hello;
  hello.set_protocol_version(v1::PROTOCOL_VERSION_1);
  hello.set_run_id("run-1.a:b_c");
  hello.set_rank(3);
  hello.set_local_rank(1);
  hello.set_world_size(8);
  hello.set_host("node-7");
  for (int i = 0; i < 4; ++i) {
    auto* layer = hello.add_layers();
    layer->set_index(static_cast<std::uint32_t>(i));
    layer->set_name("model.layers." + std::to_string(i) + ".attn");
    layer->set_backend(v1::BACKEND_STOCK);
  }
  return hello;
}

v1::Sample good_sample() {
  v1::Sample sample;
  sample.set_step(10);
  sample.set_layer(2);
  sample.set_backend(v1::BACKEND_STOCK);
  sample.mutable_metrics()->set_live_dq_discrepancy(0.02);
  sample.mutable_shape()->set_query_heads(16);
  sample.mutable_shape()->set_key_value_heads(4);
  sample.mutable_shape()->set_dtype("bfloat16");
  return sample;
}

TEST(MessageValidator, CatalogueAndWireAgree) {
  // Every catalogue metric has its LayerMetrics field and vice versa.
  EXPECT_NO_THROW(metric_fields());
  EXPECT_EQ(static_cast<std::size_t>(v1::LayerMetrics::descriptor()->field_count()),
            reference::kMetricCount);
}

TEST(MessageValidator, GoodMessagesPass) {
  const Limits limits;
  EXPECT_TRUE(validate_hello(good_hello(), limits).ok());
  EXPECT_TRUE(validate_sample(good_sample(), 4, limits).ok());
}

TEST(MessageValidator, BadHellosAreRejectedWithReason) {
  const Limits limits;
  auto check = [&](auto mutate, RejectReason reason) {
    v1::Hello hello = good_hello();
    mutate(hello);
    const Verdict verdict = validate_hello(hello, limits);
    EXPECT_EQ(verdict.reason, reason) << verdict.detail;
    EXPECT_FALSE(verdict.detail.empty());
  };
  check([](v1::Hello& h) { h.set_protocol_version(v1::PROTOCOL_VERSION_UNSPECIFIED); },
        RejectReason::kProtocolVersion);
  check([](v1::Hello& h) { h.set_run_id(""); }, RejectReason::kRunId);
  check([](v1::Hello& h) { h.set_run_id("run 1"); }, RejectReason::kRunId);
  check([](v1::Hello& h) { h.set_run_id("a\"b"); }, RejectReason::kRunId);
  check([](v1::Hello& h) { h.set_run_id(std::string(129, 'a')); }, RejectReason::kRunId);
  check([](v1::Hello& h) { h.set_rank(8); }, RejectReason::kRank);
  check([](v1::Hello& h) { h.set_world_size(0); }, RejectReason::kRank);
  check([](v1::Hello& h) { h.set_host(std::string(300, 'h')); }, RejectReason::kString);
  check([](v1::Hello& h) { h.set_host("a\nb"); }, RejectReason::kString);
  check([](v1::Hello& h) { h.clear_layers(); }, RejectReason::kLayers);
  check([](v1::Hello& h) { h.mutable_layers(1)->set_index(5); }, RejectReason::kLayers);
  check([](v1::Hello& h) { h.mutable_layers(1)->set_backend(static_cast<v1::Backend>(42)); },
        RejectReason::kBackend);
  Limits small;
  small.max_layers = 2;
  EXPECT_EQ(validate_hello(good_hello(), small).reason, RejectReason::kLayers);
}

TEST(MessageValidator, BadSamplesAreRejectedWithReason) {
  const Limits limits;
  auto check = [&](auto mutate, RejectReason reason) {
    v1::Sample sample = good_sample();
    mutate(sample);
    EXPECT_EQ(validate_sample(sample, 4, limits).reason, reason);
  };
  check([](v1::Sample& s) { s.set_layer(4); }, RejectReason::kLayerIndex);
  check([](v1::Sample& s) { s.set_backend(v1::BACKEND_UNSPECIFIED); }, RejectReason::kBackend);
  check([](v1::Sample& s) { s.mutable_metrics()->set_key_rms(std::nan("")); }, RejectReason::kMetric);
  check([](v1::Sample& s) {
    s.mutable_metrics()->set_logit_abs_max(std::numeric_limits<double>::infinity());
  }, RejectReason::kMetric);
  check([](v1::Sample& s) { s.mutable_metrics()->set_row_mass_abs_max(-1); }, RejectReason::kMetric);
  check([](v1::Sample& s) { s.mutable_shape()->set_key_value_heads(3); }, RejectReason::kShape);
  check([](v1::Sample& s) { s.mutable_timings()->set_audit_us(-5); }, RejectReason::kTiming);

  v1::SampleBatch batch;
  EXPECT_EQ(validate_batch(batch, 4, limits).reason, RejectReason::kBatchSize);
  *batch.add_samples() = good_sample();
  *batch.add_samples() = good_sample();
  batch.mutable_samples(1)->set_layer(9);
  const Verdict verdict = validate_batch(batch, 4, limits);
  EXPECT_EQ(verdict.reason, RejectReason::kLayerIndex);
  EXPECT_NE(verdict.detail.find("samples[1]"), std::string::npos);
}

TEST(MessageValidator, Acks) {
  v1::CommandAck ack;
  EXPECT_EQ(validate_ack(ack).reason, RejectReason::kAck);
  ack.set_command_id(3);
  EXPECT_EQ(validate_ack(ack).reason, RejectReason::kAck);
  ack.set_status(v1::ACK_STATUS_APPLIED);
  EXPECT_TRUE(validate_ack(ack).ok());
}

}  // namespace
}  // namespace gaugewatch::agent
