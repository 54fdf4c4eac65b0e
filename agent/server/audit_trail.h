#pragma once
// The audit log as the agent's parts write it: one AuditRecord per admin
// action, rule firing, command sent and acknowledgement, stored in SQLite.

#include <cstdint>
#include <string>

#include "agent/state/agent_counters.h"
#include "agent/store/decision_store.h"
#include "gaugewatch/v1/admin_service.pb.h"

namespace gaugewatch::agent {

class AuditTrail {
 public:
  AuditTrail(DecisionStore& store, AgentCounters& counters) : store_(store), counters_(counters) {}

  // rank null: the record names no rank. Throws StoreError.
  void record(gaugewatch::v1::AuditKind kind, const std::string& run_id, const std::uint32_t* rank,
              std::uint64_t command_id, std::uint64_t decision_id, std::string detail);
  // Same, for records of an action already taken (a command sent, an ack):
  // a store error is counted in store_errors_total instead of thrown.
  void record_or_count(gaugewatch::v1::AuditKind kind, const std::string& run_id, const std::uint32_t* rank,
                       std::uint64_t command_id, std::uint64_t decision_id, std::string detail);

 private:
  DecisionStore& store_;
  AgentCounters& counters_;
};

}  // namespace gaugewatch::agent
