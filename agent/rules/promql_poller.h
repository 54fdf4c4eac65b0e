#pragma once
// Fleet-wide rules: polls instant PromQL queries against a Prometheus HTTP
// API (/api/v1/query) and turns series present for for_polls consecutive
// polls into switch decisions, so every node's agent switches the same
// layers. A series fires once; it re-arms after it leaves the result.

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "agent/config/agent_config.h"
#include "agent/server/controller.h"

namespace gaugewatch::agent {

// One series of an instant-vector result.
struct PromqlSeries {
  std::map<std::string, std::string> labels;
  double value = 0.0;
};

// Parses a /api/v1/query JSON answer. Throws std::runtime_error.
std::vector<PromqlSeries> parse_promql_response(const std::string& json);

class PromqlPoller {
 public:
  PromqlPoller(const AgentConfig& config, Controller& controller);
  // Runs every rule once; errors are counted and logged, never thrown.
  void poll_once();

 private:
  struct RuleState {
    std::map<std::string, std::uint32_t> consecutive;  // key -> polls seen in a row
    std::set<std::string> fired;
  };
  void evaluate(const PromqlRule& rule, RuleState& state, const std::vector<PromqlSeries>& result);

  const std::vector<PromqlRule> rules_;
  Controller& controller_;
  std::string host_;
  std::uint16_t port_ = 0;
  std::string base_path_;
  std::vector<RuleState> states_;
};

}  // namespace gaugewatch::agent
