// Dashboards and Prometheus rules may use only metric names from the agent's
// catalogue (docs/agent.md: one table lists every metric; dashboards and rules
// use only its names).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "agent/export/metric_catalogue.h"

namespace gaugewatch::agent {
namespace {

std::set<std::string> allowed_names() {
  std::set<std::string> names;
  for (const auto& metric : exported_catalogue()) {
    names.insert(metric.name);
    if (metric.type == MetricType::kHistogram) {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) names.insert(metric.name + suffix);
    }
  }
  return names;
}

TEST(DashboardNames, EveryMetricNameIsInTheCatalogue) {
  const std::filesystem::path root = std::filesystem::path(GAUGEWATCH_SOURCE_DIR) / "dashboards";
  ASSERT_TRUE(std::filesystem::is_directory(root)) << root;
  const auto allowed = allowed_names();
  // A metric name: not followed by '.' (file names such as gaugewatch_rules.yml).
  const std::regex token("gaugewatch_[a-z0-9_]+(?![a-z0-9_.])");
  std::size_t files = 0;
  std::size_t uses = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    const auto ext = entry.path().extension();
    if (ext != ".json" && ext != ".yml" && ext != ".yaml") continue;
    ++files;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string content = text.str();
    for (auto it = std::sregex_iterator(content.begin(), content.end(), token);
         it != std::sregex_iterator(); ++it) {
      ++uses;
      EXPECT_TRUE(allowed.count(it->str())) << entry.path() << " uses " << it->str()
                                            << ", which is not in the metric catalogue";
    }
  }
  EXPECT_GE(files, 3u);
  EXPECT_GE(uses, 20u);
}

TEST(DashboardNames, DocsListEveryCatalogueMetric) {
  std::ifstream in(std::filesystem::path(GAUGEWATCH_SOURCE_DIR) / "docs" / "agent.md");
  ASSERT_TRUE(in) << "docs/agent.md missing";
  std::stringstream text;
  text << in.rdbuf();
  for (const auto& metric : exported_catalogue()) {
    EXPECT_NE(text.str().find("`" + metric.name + "`"), std::string::npos)
        << metric.name << " is not in docs/agent.md (regenerate: gaugewatch-agent --print-catalogue)";
  }
}

}  // namespace
}  // namespace gaugewatch::agent
