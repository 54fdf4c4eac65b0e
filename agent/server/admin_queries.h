#pragma once
// The admin API's read side: the agent's status, the runs it knows with
// their ranks and layers, and the stored decisions and audit log.

#include <cstddef>
#include <cstdint>

#include "agent/config/agent_config.h"
#include "agent/state/agent_counters.h"
#include "agent/state/decision_book.h"
#include "agent/state/run_registry.h"
#include "agent/store/decision_store.h"
#include "gaugewatch/v1/admin_service.pb.h"

namespace gaugewatch::agent {

class AdminQueries {
 public:
  AdminQueries(const AgentConfig& config, const RunRegistry& registry, DecisionStore& store,
               const DecisionBook& book, const AgentCounters& counters, std::size_t rule_count,
               std::int64_t start_unix_ns)
      : config_(config), registry_(registry), store_(store), book_(book), counters_(counters),
        rule_count_(rule_count), start_unix_ns_(start_unix_ns) {}

  void status(gaugewatch::v1::GetStatusResponse& out) const;
  void list_runs(const gaugewatch::v1::ListRunsRequest& request, gaugewatch::v1::ListRunsResponse& out) const;
  // Throws StoreError.
  void list_decisions(const gaugewatch::v1::ListDecisionsRequest& request,
                      gaugewatch::v1::ListDecisionsResponse& out) const;

 private:
  const AgentConfig& config_;
  const RunRegistry& registry_;
  DecisionStore& store_;
  const DecisionBook& book_;
  const AgentCounters& counters_;
  const std::size_t rule_count_;
  const std::int64_t start_unix_ns_;
};

}  // namespace gaugewatch::agent
