#pragma once
// Commands to connected trainers: the streams that said Hello, the commands
// queued on them (ids, pending until acknowledged), the acknowledgements
// (a switch applied moves the layer's backend; a run-wide switch rejected as
// late is re-sent with a later step to every rank of the run), each logged
// and audited.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "agent/rules/run_steps.h"
#include "agent/server/audit_trail.h"
#include "agent/server/session.h"
#include "agent/state/agent_counters.h"
#include "gaugewatch/v1/admin_service.pb.h"
#include "gaugewatch/v1/hook_service.pb.h"

namespace gaugewatch::agent {

class CommandFanout {
 public:
  // Command ids continue after `last_command_id` (the store's largest).
  CommandFanout(std::uint64_t last_command_id, AgentCounters& counters, AuditTrail& audit, RunSteps& run_steps);

  // A stream that said Hello receives commands from now on.
  void add(const std::shared_ptr<Session>& session);
  // Returns whether the session was added.
  bool remove(std::uint64_t session_id);
  std::shared_ptr<Session> find(std::uint64_t session_id) const;
  std::vector<std::shared_ptr<Session>> sessions() const;

  // Queues a command on one session (pending until acked); logs and audits
  // it. False when the stream is closed or its outbox full (counted).
  bool send_to(Session& session, gaugewatch::v1::Command command, const std::string& what);
  // Queues a switch of `layers` to `backend`; false if it could not be queued.
  bool send_switch(Session& session, std::vector<std::uint32_t> layers, gaugewatch::v1::Backend backend,
                   std::uint64_t decision_id, const std::string& reason, std::uint64_t effective_step);
  // Sends a switch to every session the target covers (the covered layers of
  // each); returns the commands queued.
  std::uint32_t switch_target(const gaugewatch::v1::Target& target, gaugewatch::v1::Backend backend,
                              std::uint64_t decision_id, const std::string& reason, std::uint64_t effective_step);
  // Sends a non-switch command (sampling, capture) to every session the
  // target's run/rank covers (capture: only where the layer exists); audited
  // as an admin action by `who` plus one COMMAND_SENT per trainer.
  std::uint32_t send_command(const gaugewatch::v1::Target& target, const gaugewatch::v1::Command& command,
                             const std::string& who);

  // A validated acknowledgement from `session`.
  void acknowledge(Session& session, const gaugewatch::v1::CommandAck& ack);

 private:
  // A rank rejected a run-wide switch as late: send the decision again, with
  // a later effective step, to every rank of the run.
  void reissue_late_switch(const Session& session, const gaugewatch::v1::Command& command,
                           std::uint64_t rank_step);

  AgentCounters& counters_;
  AuditTrail& audit_;
  RunSteps& run_steps_;
  std::atomic<std::uint64_t> next_command_id_;
  mutable std::mutex mu_;
  std::unordered_map<std::uint64_t, std::shared_ptr<Session>> sessions_;
};

}  // namespace gaugewatch::agent
