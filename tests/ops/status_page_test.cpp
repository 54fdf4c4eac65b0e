// The status page renderer on its own: text from trainers (run ids, module
// names, reasons) is escaped, sparklines follow the values on a log scale,
// and the page names its parts the way the browser test reads them.

#include <gtest/gtest.h>

#include <string>

#include "agent/export/status_page.h"
#include "agent/export/status_page_snapshot.h"
#include "agent/state/recent_values.h"

namespace gaugewatch::agent {
namespace {

StatusView one_layer_view(const std::string& name) {
  StatusLayer layer;
  layer.index = 0;
  layer.name = name;
  layer.backend = "gproj";
  layer.desired = "gproj";
  layer.live_dq = 0.002;
  layer.recent_live_dq = {0.3, 0.3, 0.002};
  StatusRank rank;
  rank.host = "node-1";
  rank.layers = {layer};
  StatusView view;
  view.agent_version = "test";
  view.runs = {{"run-1", {rank}}};
  return view;
}

TEST(StatusPage, EscapesWhatTrainersSend) {
  EXPECT_EQ(html_escape("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
  const std::string page = render_status_page(one_layer_view("<script>alert(1)</script>"));
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
}

TEST(StatusPage, SparklineIsLogScaledAndClamped) {
  // 100% at the top, 0.01% (and below) at the bottom, 1% half way.
  EXPECT_EQ(sparkline_points({1.0, 0.01, 1e-4, 1e-9}, 100, 42), "1.0,1.0 33.7,21.0 66.3,41.0 99.0,41.0");
  EXPECT_EQ(sparkline_points({}, 100, 42), "");
  EXPECT_EQ(sparkline_points({0.05}, 100, 42), "50.0,14.0");
}

TEST(StatusPage, MarksSwitchedLayersAndPendingSwitches) {
  StatusView view = one_layer_view("blocks.0.attn");
  std::string page = render_status_page(view);
  EXPECT_NE(page.find("<tr class=\"layer switched\" data-layer=\"0\" data-backend=\"gproj\">"),
            std::string::npos);
  EXPECT_NE(page.find("data-points=\"3\""), std::string::npos);
  view.runs[0].ranks[0].layers[0].backend = "stock";
  page = render_status_page(view);
  EXPECT_NE(page.find("class=\"backend pending\""), std::string::npos);
}

TEST(StatusPage, RecentValuesKeepTheLastOnesOldestFirst) {
  RecentValues recent;
  EXPECT_TRUE(recent.oldest_first().empty());
  for (std::uint32_t i = 1; i <= RecentValues::kCapacity + 5; ++i) recent.add(i);
  const auto values = recent.oldest_first();
  ASSERT_EQ(values.size(), RecentValues::kCapacity);
  EXPECT_EQ(values.front(), 6.0);
  EXPECT_EQ(values.back(), static_cast<double>(RecentValues::kCapacity + 5));
}

TEST(StatusPage, RunFilterFromTheQueryString) {
  using Runs = std::vector<std::string>;
  EXPECT_EQ(runs_from_query(""), Runs{});
  EXPECT_EQ(runs_from_query("run=a,b"), (Runs{"a", "b"}));
  EXPECT_EQ(runs_from_query("x=1&run=a%2Cb&run=c,,"), (Runs{"a", "b", "c"}));
  EXPECT_EQ(runs_from_query("run=bad%2"), Runs{"bad%2"});
}

}  // namespace
}  // namespace gaugewatch::agent
