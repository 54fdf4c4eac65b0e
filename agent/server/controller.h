#pragma once
// The transport-agnostic core of the agent: trainer sessions, sample
// ingestion with rule evaluation, switch decisions (stored, applied to the
// state, sent as commands) and the admin queries. The gRPC services and the
// PromQL poller are thin wrappers around it.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/common/event_log.h"
#include "agent/config/agent_config.h"
#include "agent/rules/escalation.h"
#include "agent/server/message_validator.h"
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
  // Counts a message the transport refused before it was a TrainerMessage
  // (unparseable, too large); returns the verdict for the stream's status.
  Verdict reject_transport(RejectReason reason, std::string detail) {
    return count({reason, std::move(detail)}, 0);
  }
  // Loads the stored decisions into the book. Throws StoreError.
  Controller(const AgentConfig& config, DecisionStore& store, AgentCounters& counters);

  std::shared_ptr<Session> open_session();
  // Handles one trainer message; a rejected message is counted and its
  // verdict returned (the stream then ends with that status).
  Verdict handle(const std::shared_ptr<Session>& session,
                 const gaugewatch::v1::TrainerMessage& message);
  void close_session(Session& session);

  struct DecisionResult {
    std::uint64_t decision_id = 0;
    std::uint32_t commands_sent = 0;
  };
  // Records a switch decision and sends it to every connected trainer it
  // covers. Throws StoreError if it cannot be stored (nothing is sent then).
  DecisionResult decide(gaugewatch::v1::DecisionSource source, const std::string& rule,
                        const gaugewatch::v1::Target& target, gaugewatch::v1::Backend backend,
                        const std::string& reason);

  // Sends a non-switch command (sampling, capture) to every connected trainer
  // the target's run/rank covers (capture: only where the layer exists).
  // Audited as an admin action plus one COMMAND_SENT per trainer.
  std::uint32_t send_command(const gaugewatch::v1::Target& target,
                             const gaugewatch::v1::Command& command, const std::string& who);

  void status(gaugewatch::v1::GetStatusResponse& out) const;
  void list_runs(const gaugewatch::v1::ListRunsRequest& request,
                 gaugewatch::v1::ListRunsResponse& out) const;
  void list_decisions(const gaugewatch::v1::ListDecisionsRequest& request,
                      gaugewatch::v1::ListDecisionsResponse& out) const;

  // Expires silent ranks (call periodically).
  void expire_ranks();
  // Prunes the SQLite store by the configured retention (call periodically,
  // off the hot path); exports the rows deleted and left. A store error is
  // counted and logged, and the next pass tries again.
  void enforce_retention();

  const DecisionBook& book() const { return book_; }
  RunRegistry& registry() { return registry_; }
  const RunRegistry& registry() const { return registry_; }
  AgentCounters& counters() { return counters_; }
  const AgentConfig& config() const { return config_; }
  std::size_t rule_count() const { return rules_.size(); }

 private:
  struct Firing {
    std::size_t rule;
    std::uint32_t layer;
    double value;
    std::uint64_t step;
    Escalation escalation;  // the backend chosen for this layer, and why
  };

  // Counts (and logs, rate-limited) a rejection; passes the verdict on.
  Verdict count(Verdict verdict, std::size_t samples);
  Verdict on_hello(const std::shared_ptr<Session>& session, const gaugewatch::v1::Hello& hello);
  Verdict on_batch(Session& session, const gaugewatch::v1::SampleBatch& batch);
  Verdict on_ack(Session& session, const gaugewatch::v1::CommandAck& ack);
  Verdict on_goodbye(Session& session, const gaugewatch::v1::Goodbye& goodbye);
  // Queues a non-switch command on one session (pending until acked); audits it.
  bool send_to(Session& session, gaugewatch::v1::Command command, const std::string& what);
  void fire(const Session& session, const Firing& firing);
  // Queues a switch command; audits it. Returns false if it could not be queued.
  bool send_switch(Session& session, std::vector<std::uint32_t> layers,
                   gaugewatch::v1::Backend backend, std::uint64_t decision_id,
                   const std::string& reason);
  void audit(gaugewatch::v1::AuditKind kind, const std::string& run_id, const std::uint32_t* rank,
             std::uint64_t command_id, std::uint64_t decision_id, std::string detail);
  std::vector<std::shared_ptr<Session>> sessions() const;

  const AgentConfig config_;
  const std::vector<ThresholdRule> rules_;
  DecisionStore& store_;
  AgentCounters& counters_;
  RunRegistry registry_;
  DecisionBook book_;
  const std::int64_t start_unix_ns_;
  std::atomic<std::uint64_t> next_session_id_{1};
  std::atomic<std::uint64_t> next_command_id_;
  mutable std::mutex sessions_mu_;
  std::unordered_map<std::uint64_t, std::shared_ptr<Session>> sessions_;
  LogRateLimit rejection_log_{5.0};  // rejections logged per second, at most
};

}  // namespace gaugewatch::agent
