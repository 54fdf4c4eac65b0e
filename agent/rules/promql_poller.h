#pragma once
// Fleet-wide rules: polls instant PromQL queries against a Prometheus HTTP
// API (/api/v1/query) and turns series present for for_polls consecutive
// polls into switch decisions, so every node's agent switches the same
// layers. A series fires once; it re-arms after it leaves the result.
//
// Every agent asks about the same instants (multiples of the poll interval,
// two intervals back so that every scrape up to the instant is stored), so
// all agents see the same series fire at the same instant T; a series with a
// `run` label (and no `rank`) switches the whole run from the step computed
// from the run's gaugewatch_rank_step at T, the same on every node
// (docs/scaling.md, "Across nodes").

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "agent/config/agent_config.h"
#include "agent/rules/rule.h"
#include "agent/state/agent_counters.h"

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
  // Firings go to `decisions`; queries and their errors are counted in `counters`.
  PromqlPoller(const AgentConfig& config, DecisionSink& decisions, AgentCounters& counters);
  // Runs every rule once; errors are counted and logged, never thrown.
  void poll_once();

 private:
  struct RuleState {
    std::map<std::string, std::uint32_t> consecutive;  // key -> polls seen in a row
    std::set<std::string> fired;
    std::int64_t last_instant = 0;  // unix seconds of the latest instant evaluated
  };
  // Throws on a query that fails (the instant is evaluated again next poll).
  std::vector<PromqlSeries> query(const std::string& promql, std::int64_t instant);
  void evaluate(const PromqlRule& rule, RuleState& state, const std::vector<PromqlSeries>& result,
                std::int64_t instant);
  // The effective step of a run-wide fleet decision that fired at `instant`.
  std::uint64_t fleet_step(const std::string& run_id, std::int64_t instant);

  const std::vector<PromqlRule> rules_;
  DecisionSink& decisions_;
  AgentCounters& counters_;
  std::uint32_t max_run_id_bytes_ = 0;
  std::string host_;
  std::uint16_t port_ = 0;
  std::string base_path_;
  std::vector<RuleState> states_;
  double interval_s_ = 30.0;
  double delivery_s_ = 2.0;
};

}  // namespace gaugewatch::agent
