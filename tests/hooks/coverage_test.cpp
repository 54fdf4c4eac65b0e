// The coverage book (hooks/coverage.h) as the interceptor feeds it, and its
// way into the stats and the agent's SampleBatch.

#include <gtest/gtest.h>

#include "gaugewatch/v1/hook_service.pb.h"
#include "hooks/coverage.h"
#include "hooks/reporter_wire.h"
#include "hooks/runtime.h"

namespace gaugewatch::hooks {
namespace {

const CallVerdict kMonitored{true, "", {Backend::kGproj, Backend::kPivot, Backend::kFp32, Backend::kCenter}};
const CallVerdict kMasked{true, "", {Backend::kCenter}};
const CallVerdict kDropout{false, "dropout", {Backend::kCenter}};

TEST(Coverage, CountsByReasonAndKeepsPerLayerStatus) {
  Coverage c;
  c.count(0, kMonitored);
  c.count(1, kMonitored);
  c.count(1, kMasked);    // a masked call: the fused kernels no longer take every call of layer 1
  c.count(2, kDropout);
  c.count(-1, CallVerdict{false, "math_path", {}});
  EXPECT_EQ(c.total_calls(), 5u);
  EXPECT_EQ(c.monitored_calls(), 3u);
  ASSERT_NE(c.layer(1), nullptr);
  EXPECT_TRUE(c.layer(1)->monitored);
  EXPECT_EQ(c.layer(1)->correcting_backends, (std::vector<Backend>{Backend::kCenter}));
  EXPECT_FALSE(c.layer(2)->monitored);
  EXPECT_EQ(c.layer(2)->reason, "dropout");
  EXPECT_EQ(c.layer(3), nullptr);
  EXPECT_EQ(c.summary(),
            "attention calls: 3 monitored, 2 not monitored (dropout 1, math_path 1); layers not monitored: 2: dropout");
}

TEST(Coverage, ReportsOnlyLayersChangedSinceAVersion) {
  Coverage c;
  c.count(0, kMonitored);
  c.count(1, kMonitored);
  const std::uint64_t v = c.version();
  c.count(0, kMonitored);  // no change
  EXPECT_EQ(c.version(), v);
  EXPECT_TRUE(c.report(v).layers.empty());
  c.count(1, kDropout);
  const CoverageReport r = c.report(v);
  ASSERT_EQ(r.layers.size(), 1u);
  EXPECT_EQ(r.layers[0].layer, 1u);
  EXPECT_FALSE(r.layers[0].monitored);
  EXPECT_EQ(c.report(0).layers.size(), 2u);
  ASSERT_EQ(r.calls.size(), 2u);  // (monitored, ""), (not, "dropout"): totals every time
}

TEST(Coverage, TravelsInTheSampleBatchAndTheStats) {
  HookConfig config;
  config.socket = "none";
  config.every_n_steps = 1;
  config.layer_fraction = 1.0;
  Runtime rt(config);
  for (int l = 0; l < 2; ++l) {
    const ForwardPlan plan = rt.on_forward(false, false);
    rt.count_call(plan.layer, l == 0 ? kMonitored : kDropout);
  }
  gaugewatch::v1::SampleBatch batch;
  add_coverage(rt.coverage(0), batch);
  ASSERT_EQ(batch.layer_status_size(), 2);
  EXPECT_EQ(batch.layer_status(1).reason(), "dropout");
  EXPECT_EQ(batch.layer_status(0).correcting_backends(0), gaugewatch::v1::BACKEND_GPROJ);
  EXPECT_EQ(batch.layer_status(0).correcting_backends(3), gaugewatch::v1::BACKEND_CENTER);
  ASSERT_EQ(batch.attention_calls_size(), 2);
  EXPECT_EQ(batch.attention_calls(0).reason(), "dropout");  // (monitored, reason) order: not monitored first
  EXPECT_FALSE(batch.attention_calls(0).monitored());
  EXPECT_EQ(batch.attention_calls(0).calls_total(), 1u);
  const std::string stats = rt.stats_json();
  EXPECT_NE(stats.find("\"attention_calls\":[{\"calls\":1,\"monitored\":false,\"reason\":\"dropout\"},"
                       "{\"calls\":1,\"monitored\":true,\"reason\":\"\"}]"),
            std::string::npos)
      << stats;
  EXPECT_NE(stats.find("\"coverage\":{\"correcting_backends\":[\"center\"],\"monitored\":false,\"reason\":\"dropout\"}"),
            std::string::npos)
      << stats;
  SampleData sample;
  sample.correcting_backends = {Backend::kGproj, Backend::kCenter};
  const auto wire = to_wire(sample);
  ASSERT_EQ(wire.correcting_backends_size(), 2);
  EXPECT_EQ(wire.correcting_backends(1), gaugewatch::v1::BACKEND_CENTER);
}

}  // namespace
}  // namespace gaugewatch::hooks
