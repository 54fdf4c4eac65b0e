#pragma once
// The agent's self-metric counters (exported as gaugewatch_agent_*).

#include <array>
#include <atomic>
#include <cstdint>

#include "agent/server/message_validator.h"

namespace gaugewatch::agent {

struct AgentCounters {
  std::atomic<std::uint64_t> connections_total{0};
  std::atomic<std::int64_t> trainers_connected{0};
  std::atomic<std::uint64_t> samples_received_total{0};
  std::atomic<std::uint64_t> samples_rejected_total{0};
  std::atomic<std::uint64_t> hook_dropped_total{0};     // reported by trainers
  std::atomic<std::uint64_t> commands_dropped_total{0}; // outbox of a gone trainer
  std::array<std::atomic<std::uint64_t>, kRejectReasonCount> messages_rejected_total{};
  std::atomic<std::uint64_t> commands_sent_total{0};
  std::atomic<std::uint64_t> switch_commands_total{0};
  std::atomic<std::uint64_t> acks_applied_total{0};
  std::atomic<std::uint64_t> acks_rejected_total{0};
  std::atomic<std::uint64_t> acks_unknown_total{0};
  std::array<std::atomic<std::uint64_t>, 4> decisions_total{};  // by DecisionSource
  std::atomic<std::uint64_t> rule_evaluations_total{0};
  std::atomic<std::uint64_t> rule_firings_total{0};
  std::atomic<std::uint64_t> promql_queries_total{0};
  std::atomic<std::uint64_t> promql_errors_total{0};
  std::atomic<std::uint64_t> store_errors_total{0};
  std::atomic<std::uint64_t> scrapes_total{0};
  std::atomic<std::uint64_t> last_scrape_duration_ns{0};
  std::atomic<std::uint64_t> ranks_expired_total{0};
};

}  // namespace gaugewatch::agent
