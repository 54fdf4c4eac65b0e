// Agent commands (runtime.h): queued by the reporter thread, applied at step
// boundaries, acknowledged through the reporter.
#include <algorithm>
#include <string>
#include <utility>
#include <variant>

#include "hooks/log.h"
#include "hooks/runtime.h"

namespace gaugewatch::hooks {

void Runtime::ack_locked(std::uint64_t id, bool applied, const std::string& detail) {
  if (id != 0) (applied ? commands_applied_ : commands_rejected_) += 1;
  if (!applied) log_line("command " + std::to_string(id) + " rejected: " + detail);
  if (id == 0 || !reporter_) return;
  reporter_->enqueue_ack(CommandAck{id, applied, applied ? step_ : 0, detail, step_});
}

void Runtime::apply_commands_locked() {
  std::vector<Command> commands;
  commands.swap(pending_commands_);
  for (Command& command : commands) {
    const auto* sw = std::get_if<SwitchBackend>(&command.action);
    if (sw != nullptr && sw->effective_step != 0 && command.malformed.empty()) {
      wait_for_step_locked(std::move(command));
    } else {
      apply_command_locked(command);
    }
  }
  apply_due_switches_locked();
}

void Runtime::wait_for_step_locked(Command command) {
  const std::uint64_t effective = std::get<SwitchBackend>(command.action).effective_step;
  // Called at the boundary that begins step_: a switch for an earlier step
  // would reach this rank later than the others.
  if (started_ && switch_timing(effective, step_) == SwitchTiming::kLate) {
    return ack_locked(command.id, false, late_detail(effective, step_));
  }
  const std::uint64_t id = command.id;
  const std::uint64_t decision = command.decision_id;
  for (std::uint64_t replaced : waiting_switches_.add({id, decision, effective, std::move(command)})) {
    ack_locked(replaced, false, "superseded by command " + std::to_string(id) + " (effective step " +
                                    std::to_string(effective) + ")");
  }
  log_line("step " + std::to_string(step_) + ": command " + std::to_string(id) + " waits for step " +
           std::to_string(effective));
}

void Runtime::apply_due_switches_locked() {
  if (waiting_switches_.empty()) return;
  auto due = waiting_switches_.take_due(step_);
  for (const auto& entry : due.late) ack_locked(entry.command_id, false, late_detail(entry.effective_step, step_));
  for (const auto& entry : due.apply) apply_command_locked(entry.command);
}

void Runtime::apply_command_locked(const Command& command) {
  if (!command.malformed.empty()) return ack_locked(command.id, false, command.malformed);
  if (const auto* sw = std::get_if<SwitchBackend>(&command.action)) return apply_switch_locked(command, *sw);
  if (const auto* capture = std::get_if<CaptureOperands>(&command.action)) {
    return apply_capture_locked(command, *capture);
  }
  if (const auto* policy = std::get_if<SamplingPolicy>(&command.action)) {
    apply_sampling_locked(*policy);
    return ack_locked(command.id, true, "");
  }
  return ack_locked(command.id, false, "command without an action");
}

void Runtime::apply_switch_locked(const Command& command, const SwitchBackend& sw) {
  const std::uint64_t id = command.id;
  if (!backend_spec(sw.backend).layer) {
    return ack_locked(id, false, "backend " + std::string(backend_name(sw.backend)) + " is not one a layer can run (" +
                                     backend_names([](const BackendSpec& s) { return s.layer; }) + ")");
  }
  std::vector<std::size_t> targets;
  if (sw.layers.empty()) {
    for (std::size_t l = 0; l < layers_.size(); ++l) targets.push_back(l);
  }
  for (std::uint32_t l : sw.layers) {
    if (l >= layers_.size()) {
      return ack_locked(id, false, "layer " + std::to_string(l) + " out of range (" +
                                       std::to_string(layers_.size()) + " layers)");
    }
    targets.push_back(l);
  }
  std::string list;
  for (std::size_t l : targets) {
    layers_[l].backend = sw.backend;
    list += (list.empty() ? "" : ",") + std::to_string(l);
  }
  log_line("step " + std::to_string(step_) + ": command " + std::to_string(id) + " switches layer(s) [" + list +
           "] to " + std::string(backend_name(sw.backend)) +
           (command.reason.empty() ? "" : " (" + command.reason + ")"));
  if (command.restored) {
    // The agent held this decision for the run id before this process sent anything.
    log_line(config_.run_id_source == "GAUGEWATCH_RUN_ID"
                 ? "run id '" + config_.run_id + "' was given (--run-id / GAUGEWATCH_RUN_ID): command " +
                       std::to_string(id) + " restores an earlier decision of that run"
                 : "command " + std::to_string(id) + " restores a decision the agent held for run '" + config_.run_id +
                       "' (id from " + config_.run_id_source + ")");
  }
  ack_locked(id, true, "");
}

void Runtime::apply_capture_locked(const Command& command, const CaptureOperands& capture) {
  const std::uint64_t id = command.id;
  if (config_.capture_dir.empty()) return ack_locked(id, false, "capture disabled: GAUGEWATCH_CAPTURE_DIR is unset");
  if (capture.layer >= layers_.size()) {
    return ack_locked(id, false, "capture layer " + std::to_string(capture.layer) + " out of range");
  }
  const std::uint32_t count = std::clamp<std::uint32_t>(capture.count, 1, 100);
  capture_arms_[capture.layer] += count;
  log_line("step " + std::to_string(step_) + ": command " + std::to_string(id) + " captures " +
           std::to_string(count) + " call(s) of layer " + std::to_string(capture.layer));
  ack_locked(id, true, "");
}

void Runtime::apply_sampling_locked(const SamplingPolicy& p) {
  if (p.every_n_steps != 0) every_n_steps_ = p.every_n_steps;
  if (p.layer_fraction > 0.0 && p.layer_fraction <= 1.0) layer_fraction_ = p.layer_fraction;
  if (p.max_heads != 0) max_heads_ = p.max_heads;
  if (p.max_rows != 0) max_rows_ = p.max_rows;
  if (p.overhead_budget > 0.0 && p.overhead_budget <= 1.0) overhead_budget_ = p.overhead_budget;
}

void Runtime::on_command(Command command) {
  std::lock_guard lock(mu_);
  // A switch whose step has begun is rejected as it arrives, so that the
  // agent hears at once (not a step later) that it must re-issue it.
  if (const auto* sw = std::get_if<SwitchBackend>(&command.action);
      sw != nullptr && sw->effective_step != 0 && started_ && sw->effective_step <= step_) {
    return ack_locked(command.id, false, late_detail(sw->effective_step, step_));
  }
  if (pending_commands_.size() >= 4096) {
    ack_locked(command.id, false, "too many pending commands");
    return;
  }
  pending_commands_.push_back(std::move(command));
}

void Runtime::on_sampling(const SamplingPolicy& policy) {
  Command command;  // id 0: applied at the boundary, not acknowledged
  command.action = policy;
  on_command(std::move(command));
}

}  // namespace gaugewatch::hooks
