#pragma once
// The transport-agnostic core of the agent: trainer sessions and the
// messages they send, dispatched to the parts that act on them, and the
// entry points of the admin API and the agent's periodic upkeep. The gRPC
// services are thin wrappers around it.
//
//   sample ingestion     agent/server/sample_ingest.h (rules: agent/rules/rule.h)
//   decisions            agent/server/decision_maker.h
//   commands to trainers agent/server/command_fanout.h
//   audit log            agent/server/audit_trail.h
//   admin queries        agent/server/admin_queries.h

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/common/event_log.h"
#include "agent/config/agent_config.h"
#include "agent/rules/rule.h"
#include "agent/rules/run_steps.h"
#include "agent/server/admin_queries.h"
#include "agent/server/audit_trail.h"
#include "agent/server/command_fanout.h"
#include "agent/server/decision_maker.h"
#include "agent/server/message_validator.h"
#include "agent/server/sample_ingest.h"
#include "agent/server/session.h"
#include "agent/state/agent_counters.h"
#include "agent/state/decision_book.h"
#include "agent/state/run_registry.h"
#include "agent/store/decision_store.h"
#include "gaugewatch/v1/admin_service.pb.h"
#include "gaugewatch/v1/hook_service.pb.h"

namespace gaugewatch::agent {

class Controller {
 public:
  using DecisionResult = gaugewatch::agent::DecisionResult;

  // Loads the stored decisions into the book. Throws StoreError.
  Controller(const AgentConfig& config, DecisionStore& store, AgentCounters& counters);

  // Counts a message the transport refused before it was a TrainerMessage
  // (unparseable, too large); returns the verdict for the stream's status.
  Verdict reject_transport(RejectReason reason, std::string detail) {
    return count({reason, std::move(detail)}, 0);
  }

  std::shared_ptr<Session> open_session();
  // Handles one trainer message; a rejected message is counted and its
  // verdict returned (the stream then ends with that status).
  Verdict handle(const std::shared_ptr<Session>& session,
                 const gaugewatch::v1::TrainerMessage& message);
  void close_session(Session& session);

  // Records a switch decision and sends it to every connected trainer it
  // covers (DecisionMaker::record). Throws StoreError if it cannot be stored.
  DecisionResult decide(gaugewatch::v1::DecisionSource source, const std::string& rule,
                        const gaugewatch::v1::Target& target, gaugewatch::v1::Backend backend,
                        const std::string& reason, std::optional<std::uint64_t> effective_step = std::nullopt) {
    return decisions_.record({source, rule, target, backend, reason, effective_step});
  }

  // Sends a non-switch command (sampling, capture) to every connected trainer
  // the target's run/rank covers (CommandFanout::send_command).
  std::uint32_t send_command(const gaugewatch::v1::Target& target,
                             const gaugewatch::v1::Command& command, const std::string& who) {
    return fanout_.send_command(target, command, who);
  }

  void status(gaugewatch::v1::GetStatusResponse& out) const { queries_.status(out); }
  void list_runs(const gaugewatch::v1::ListRunsRequest& request,
                 gaugewatch::v1::ListRunsResponse& out) const {
    queries_.list_runs(request, out);
  }
  void list_decisions(const gaugewatch::v1::ListDecisionsRequest& request,
                      gaugewatch::v1::ListDecisionsResponse& out) const {
    queries_.list_decisions(request, out);
  }

  // Expires silent ranks (call periodically).
  void expire_ranks();
  // Prunes the SQLite store by the configured retention (call periodically,
  // off the hot path); exports the rows deleted and left. A store error is
  // counted and logged, and the next pass tries again.
  void enforce_retention();

  // Where timer-driven rules (the PromQL poller) send their decisions.
  DecisionSink& decisions() { return decisions_; }
  const DecisionBook& book() const { return book_; }
  RunRegistry& registry() { return registry_; }
  const RunRegistry& registry() const { return registry_; }
  AgentCounters& counters() { return counters_; }
  const AgentConfig& config() const { return config_; }
  std::size_t rule_count() const { return rules_.size(); }

 private:
  // Counts (and logs, rate-limited) a rejection; passes the verdict on.
  Verdict count(Verdict verdict, std::size_t samples);
  Verdict on_hello(const std::shared_ptr<Session>& session, const gaugewatch::v1::Hello& hello);
  Verdict on_batch(Session& session, const gaugewatch::v1::SampleBatch& batch);
  Verdict on_ack(Session& session, const gaugewatch::v1::CommandAck& ack);
  Verdict on_goodbye(Session& session, const gaugewatch::v1::Goodbye& goodbye);

  const AgentConfig config_;
  const std::vector<std::unique_ptr<SampleRule>> rules_;
  DecisionStore& store_;
  AgentCounters& counters_;
  RunRegistry registry_;
  DecisionBook book_;
  RunSteps run_steps_;
  AuditTrail audit_;
  CommandFanout fanout_;
  DecisionMaker decisions_;
  SampleIngest ingest_;
  AdminQueries queries_;
  std::atomic<std::uint64_t> next_session_id_{1};
  LogRateLimit rejection_log_{5.0};  // rejections logged per second, at most
};

}  // namespace gaugewatch::agent
