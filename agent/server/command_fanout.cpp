#include "agent/server/command_fanout.h"

#include <optional>

#include "agent/common/backend_names.h"
#include "agent/common/clock.h"
#include "agent/common/event_log.h"
#include "agent/state/decision_book.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

CommandFanout::CommandFanout(std::uint64_t last_command_id, AgentCounters& counters, AuditTrail& audit,
                             RunSteps& run_steps)
    : counters_(counters), audit_(audit), run_steps_(run_steps), next_command_id_(last_command_id + 1) {}

void CommandFanout::add(const std::shared_ptr<Session>& session) {
  std::lock_guard lock(mu_);
  sessions_[session->id()] = session;
}

bool CommandFanout::remove(std::uint64_t session_id) {
  std::lock_guard lock(mu_);
  return sessions_.erase(session_id) > 0;
}

std::shared_ptr<Session> CommandFanout::find(std::uint64_t session_id) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session_id);
  return it == sessions_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Session>> CommandFanout::sessions() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<Session>> out;
  out.reserve(sessions_.size());
  for (const auto& [id, session] : sessions_) out.push_back(session);
  return out;
}

bool CommandFanout::send_to(Session& session, v1::Command command, const std::string& what) {
  const std::uint64_t id = next_command_id_.fetch_add(1);
  const std::uint64_t decision_id = command.decision_id();
  const std::string reason = command.reason();
  command.set_command_id(id);
  {
    std::lock_guard lock(session.pending_mu);
    session.pending[id] = command;
  }
  v1::AgentMessage message;
  *message.mutable_command() = std::move(command);
  if (!session.push(std::move(message))) {
    counters_.commands_dropped_total.Increment();
    std::lock_guard lock(session.pending_mu);
    session.pending.erase(id);
    events().warn("command not delivered: run={} rank={} command={} ({}): stream closed or outbox full",
                  session.run_id, session.rank_index, id, what);
    return false;
  }
  counters_.commands_sent_total.Increment();
  events().info("command sent: run={} rank={} command={} decision={} {} ({})", session.run_id,
                session.rank_index, id, decision_id, what, reason);
  audit_.record_or_count(v1::AUDIT_KIND_COMMAND_SENT, session.run_id, &session.rank_index, id, decision_id, what);
  return true;
}

bool CommandFanout::send_switch(Session& session, std::vector<std::uint32_t> layers, v1::Backend backend,
                                std::uint64_t decision_id, const std::string& reason,
                                std::uint64_t effective_step) {
  v1::Command command;
  command.set_decision_id(decision_id);
  command.set_reason(reason);
  auto* sw = command.mutable_switch_backend();
  sw->set_backend(backend);
  sw->set_effective_step(effective_step);
  std::string detail = "switch to " + std::string(backend_name(backend)) + " layers";
  for (auto layer : layers) {
    sw->add_layers(layer);
    detail += " " + std::to_string(layer);
  }
  if (effective_step != 0) detail += " at step " + std::to_string(effective_step);
  if (!send_to(session, std::move(command), detail)) return false;
  counters_.switch_commands_total.Increment();
  return true;
}

std::uint32_t CommandFanout::switch_target(const v1::Target& target, v1::Backend backend,
                                           std::uint64_t decision_id, const std::string& reason,
                                           std::uint64_t effective_step) {
  std::uint32_t sent = 0;
  for (const auto& session : sessions()) {
    if (!target_covers_rank(target, session->run_id, session->rank_index)) continue;
    std::vector<std::uint32_t> layers;
    for (std::uint32_t i = 0; i < session->layer_count; ++i) {
      if (target_covers(target, session->run_id, session->rank_index, i)) layers.push_back(i);
    }
    if (layers.empty()) continue;
    if (send_switch(*session, std::move(layers), backend, decision_id, reason, effective_step)) ++sent;
  }
  return sent;
}

std::uint32_t CommandFanout::send_command(const v1::Target& target, const v1::Command& command,
                                          const std::string& who) {
  const bool capture = command.has_capture();
  const std::string what = capture ? "capture layer " + std::to_string(command.capture().layer()) +
                                         " x" + std::to_string(command.capture().count())
                                   : std::string("set sampling");
  const std::uint32_t target_rank = target.rank();
  audit_.record(v1::AUDIT_KIND_ADMIN, target.all_runs() ? "*" : target.run_id(),
                target.has_rank() ? &target_rank : nullptr, 0, 0, what + " by " + who);
  std::uint32_t sent = 0;
  for (const auto& session : sessions()) {
    if (!target_covers_rank(target, session->run_id, session->rank_index)) continue;
    if (capture && command.capture().layer() >= session->layer_count) continue;
    if (send_to(*session, command, what)) ++sent;
  }
  return sent;
}

void CommandFanout::acknowledge(Session& session, const v1::CommandAck& ack) {
  std::optional<v1::Command> command;
  {
    std::lock_guard lock(session.pending_mu);
    auto it = session.pending.find(ack.command_id());
    if (it != session.pending.end()) {
      command = std::move(it->second);
      session.pending.erase(it);
    }
  }
  const bool applied = ack.status() == v1::ACK_STATUS_APPLIED;
  // An ack of a command this stream was never sent is counted as unknown only.
  counters_.acks(!command ? AckStatus::kUnknown : applied ? AckStatus::kApplied : AckStatus::kRejected)
      .Increment();
  if (command && applied && command->has_switch_backend()) {
    std::lock_guard lock(session.rank->mu);
    for (auto layer : command->switch_backend().layers()) {
      if (layer < session.rank->layers.size()) {
        session.rank->layers[layer].backend = command->switch_backend().backend();
      }
    }
  }
  const std::string detail = (command ? "" : "unknown command; ") + std::string("step ") +
                             std::to_string(ack.applied_step()) +
                             (ack.detail().empty() ? "" : ": " + ack.detail());
  if (!command) {
    events().warn("ack of unknown command: run={} rank={} command={} {}", session.run_id,
                  session.rank_index, ack.command_id(), detail);
  } else if (applied) {
    events().info("command applied: run={} rank={} command={} {}", session.run_id,
                  session.rank_index, ack.command_id(), detail);
  } else {
    events().warn("command rejected by trainer: run={} rank={} command={} {}", session.run_id,
                  session.rank_index, ack.command_id(), detail);
  }
  audit_.record_or_count(applied ? v1::AUDIT_KIND_COMMAND_ACKED : v1::AUDIT_KIND_COMMAND_REJECTED,
                         session.run_id, &session.rank_index, ack.command_id(),
                         command ? command->decision_id() : 0, detail);
  if (command && !applied && command->has_switch_backend() && command->switch_backend().effective_step() != 0 &&
      ack.rank_step() >= command->switch_backend().effective_step()) {
    reissue_late_switch(session, *command, ack.rank_step());
  }
}

void CommandFanout::reissue_late_switch(const Session& session, const v1::Command& command,
                                        std::uint64_t rank_step) {
  const std::uint64_t late_step = command.switch_backend().effective_step();
  const auto step = run_steps_.reissue(command.decision_id(), session.run_id, late_step, rank_step, steady_now_ns());
  if (!step) return;  // another rank's rejection of the same step re-issued it already
  const std::vector<std::uint32_t> layers(command.switch_backend().layers().begin(),
                                          command.switch_backend().layers().end());
  const std::string reason = "re-issued: rank " + std::to_string(session.rank_index) + " was at step " +
                             std::to_string(rank_step) + ", past effective step " + std::to_string(late_step);
  events().warn("decision {}: {}; new effective step {}", command.decision_id(), reason, *step);
  // The audit log holds the rejection (its detail names both steps) and one
  // COMMAND_SENT per rank "at step <new>".
  for (const auto& other : sessions()) {
    if (other->run_id != session.run_id) continue;
    std::vector<std::uint32_t> covered;
    for (auto layer : layers) {
      if (layer < other->layer_count) covered.push_back(layer);
    }
    if (!covered.empty()) {
      send_switch(*other, std::move(covered), command.switch_backend().backend(), command.decision_id(), reason, *step);
    }
  }
}

}  // namespace gaugewatch::agent
