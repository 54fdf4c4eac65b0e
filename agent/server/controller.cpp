#include "agent/server/controller.h"

#include <cstdio>
#include <algorithm>
#include <map>
#include <optional>

#include "agent/common/backend_names.h"
#include "agent/common/clock.h"
#include "agent/common/event_log.h"
#include "agent/rules/threshold_rule.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

namespace {

std::string target_text(const v1::Target& target) {
  std::string out = target.all_runs() ? "all runs" : "run " + target.run_id();
  if (target.has_rank()) out += " rank " + std::to_string(target.rank());
  if (target.layers().empty()) return out + " all layers";
  out += " layers";
  for (int i = 0; i < target.layers_size(); ++i) {
    out += (i ? "," : " ") + std::to_string(target.layers(i));
  }
  return out;
}

}  // namespace

Controller::Controller(const AgentConfig& config, DecisionStore& store, AgentCounters& counters)
    : config_(config),
      rules_(effective_rules(config)),
      store_(store),
      counters_(counters),
      registry_(config.max_series, rules_.size(), config.limits.max_ranks),
      start_unix_ns_(unix_now_ns()),
      next_command_id_(store.max_command_id() + 1) {
  for (const auto& decision : store_.all_decisions()) book_.add(decision);
}

std::shared_ptr<Session> Controller::open_session() {
  auto session =
      std::make_shared<Session>(next_session_id_.fetch_add(1), config_.trainer_sample_rate,
                                config_.trainer_sample_burst, steady_now_ns());
  counters_.connections_total.Increment();
  return session;
}

Verdict Controller::count(Verdict verdict, std::size_t samples) {
  if (!verdict.ok()) {
    counters_.rejected(verdict.reason).Increment();
    counters_.samples_rejected_total.Increment(static_cast<double>(samples));
    std::uint64_t suppressed = 0;
    if (rejection_log_.admit(suppressed)) {
      events().warn("message rejected: {}: {} ({} samples){}", reject_reason_name(verdict.reason),
                    verdict.detail, samples,
                    suppressed > 0 ? " [" + std::to_string(suppressed) + " earlier rejections not logged]"
                                   : std::string());
    }
  }
  return verdict;
}

Verdict Controller::handle(const std::shared_ptr<Session>& shared, const v1::TrainerMessage& message) {
  Session& session = *shared;
  switch (message.payload_case()) {
    case v1::TrainerMessage::kHello:
      if (session.hello_done) {
        return count({RejectReason::kOutOfOrder, "second hello on one stream"}, 0);
      }
      return on_hello(shared, message.hello());
    case v1::TrainerMessage::kSamples:
      if (!session.hello_done) {
        return count({RejectReason::kOutOfOrder, "samples before hello"},
                     static_cast<std::size_t>(message.samples().samples_size()));
      }
      return on_batch(session, message.samples());
    case v1::TrainerMessage::kAck:
      if (!session.hello_done) return count({RejectReason::kOutOfOrder, "ack before hello"}, 0);
      return on_ack(session, message.ack());
    case v1::TrainerMessage::kGoodbye:
      if (!session.hello_done) return count({RejectReason::kOutOfOrder, "goodbye before hello"}, 0);
      return on_goodbye(session, message.goodbye());
    default:
      return count({RejectReason::kOutOfOrder, "empty trainer message"}, 0);
  }
}

Verdict Controller::on_hello(const std::shared_ptr<Session>& shared, const v1::Hello& hello) {
  Session& session = *shared;
  if (Verdict v = validate_hello(hello, config_.limits); !v.ok()) return count(v, 0);
  auto rank = registry_.connect(hello, session.id());
  if (!rank) {
    counters_.refused(StreamRefusal::kRankLimit).Increment();
    events().warn("trainer refused: run={} rank={}: the agent holds limits.max_ranks={} ranks",
                  hello.run_id(), hello.rank(), config_.limits.max_ranks);
    return {RejectReason::kRank, "the agent holds limits.max_ranks (" +
                                     std::to_string(config_.limits.max_ranks) +
                                     ") ranks; finished ranks are forgotten after 10x rank_expiry_seconds"};
  }
  session.hello_done = true;
  session.run_id = hello.run_id();
  session.rank_index = hello.rank();
  session.layer_count = static_cast<std::uint32_t>(hello.layers_size());
  session.rank = std::move(rank);
  events().info("trainer connected: run={} rank={} world_size={} host={} pid={} layers={} session={} peer={}",
                hello.run_id(), hello.rank(), hello.world_size(), hello.host(), hello.pid(),
                hello.layers_size(), session.id(), session.peer);

  v1::AgentMessage ack;
  auto* hello_ack = ack.mutable_hello_ack();
  hello_ack->set_protocol_version(v1::PROTOCOL_VERSION_1);
  hello_ack->set_agent_version(std::string(kAgentVersion));
  hello_ack->set_session_id(session.id());
  *hello_ack->mutable_sampling() = config_.sampling;
  session.push(std::move(ack));
  {
    std::lock_guard lock(sessions_mu_);
    sessions_[session.id()] = shared;
  }
  counters_.trainers_connected.Increment();

  // Restore the decisions that cover this trainer: re-send every switch
  // whose backend differs from what the layer runs now.
  std::map<v1::Backend, std::pair<std::vector<std::uint32_t>, std::uint64_t>> resend;
  {
    std::lock_guard lock(session.rank->mu);
    for (std::uint32_t i = 0; i < session.layer_count; ++i) {
      const auto desired = book_.desired(hello.run_id(), hello.rank(), i);
      auto& layer = session.rank->layers[i];
      layer.desired = desired.backend;
      if (desired.backend != v1::BACKEND_UNSPECIFIED && desired.backend != layer.backend) {
        auto& group = resend[desired.backend];
        group.first.push_back(i);
        group.second = std::max(group.second, desired.decision_id);
      }
    }
  }
  for (auto& [backend, group] : resend) {
    send_switch(session, std::move(group.first), backend, group.second,
                "restored decision on reconnect", run_steps_.effective_step(group.second));
  }
  return {};
}

Verdict Controller::on_batch(Session& session, const v1::SampleBatch& batch) {
  const auto samples = static_cast<std::size_t>(batch.samples_size());
  if (Verdict v = validate_batch(batch, session.layer_count, config_.limits); !v.ok()) {
    return count(v, samples);
  }
  std::vector<Firing> firings;
  RankEntry& rank = *session.rank;
  std::size_t admitted = 0;
  std::uint64_t skewed = 0;
  SampleAgeBatch ages;
  {
    std::lock_guard lock(rank.mu);
    if (rank.session_id != session.id()) {
      return count({RejectReason::kOutOfOrder,
                    "stream superseded by a newer connection of the same run and rank"},
                   samples);
    }
    rank.last_seen_steady_ns = steady_now_ns();
    rank.last_seen_unix_ns = unix_now_ns();
    rank.expired = false;
    rank.retired = false;
    // Rate limit per stream: the first `admitted` samples are applied, the
    // rest are dropped and counted. Never waits, so no other stream is held up.
    admitted = static_cast<std::size_t>(
        session.sample_bucket.take(samples, rank.last_seen_steady_ns));
    if (admitted < samples) rank.samples_shed += samples - admitted;
    rank.samples += admitted;
    if (batch.dropped_total() > rank.hook_dropped) {
      counters_.hook_dropped_total.Increment(
          static_cast<double>(batch.dropped_total() - rank.hook_dropped));
      rank.hook_dropped = batch.dropped_total();
    }
    if (batch.current_step() != 0) {
      rank.current_step = batch.current_step();
      run_steps_.observe(rank.run_id, rank.rank, batch.current_step(), rank.last_seen_steady_ns);
    }
    for (const auto& calls : batch.attention_calls()) RunRegistry::record_attention_calls(rank, calls);
    for (const auto& status : batch.layer_status()) {
      LayerEntry& layer = rank.layers[status.layer()];
      layer.monitored = status.monitored();
      layer.unmonitored_reason = status.reason();
      layer.correcting_backends.clear();
      for (const int backend : status.correcting_backends()) {
        layer.correcting_backends.push_back(static_cast<v1::Backend>(backend));
      }
    }
    std::uint64_t evaluations = 0;
    const std::int64_t now_unix = rank.last_seen_unix_ns;
    const std::int64_t skew_ns =
        static_cast<std::int64_t>(config_.limits.max_clock_skew_seconds) * 1'000'000'000;
    for (std::size_t s = 0; s < admitted; ++s) {
      const auto& sample = batch.samples(static_cast<int>(s));
      // A stamp outside the skew window (a wrong clock, or a forged value)
      // would poison the age histogram: count it and use the agent's time.
      const std::int64_t stamp = sample.unix_time_ns();
      const bool stamped = stamp != 0;
      const bool in_window = stamped && stamp > now_unix - skew_ns && stamp < now_unix + skew_ns;
      if (stamped && !in_window) ++skewed;
      if (in_window) ages.add(now_unix - stamp);
      LayerEntry& layer = rank.layers[sample.layer()];
      layer.latest = to_values(sample.metrics());
      if (sample.metrics().has_live_dq_discrepancy()) {
        layer.recent_live_dq.add(sample.metrics().live_dq_discrepancy());
      }
      layer.backend = sample.backend();
      layer.last_step = sample.step();
      layer.last_unix_ns = in_window ? stamp : now_unix;
      if (sample.correcting_backends_size() > 0) {
        layer.correcting_backends.clear();
        for (const int backend : sample.correcting_backends()) {
          layer.correcting_backends.push_back(static_cast<v1::Backend>(backend));
        }
      }
      ++layer.samples;
      registry_.admit(layer);
      for (std::size_t r = 0; r < rules_.size(); ++r) {
        const ThresholdRule& rule = rules_[r];
        const auto metric = static_cast<std::size_t>(rule.metric);
        if (!layer.latest.present.test(metric) || !rule_applies(rule, rank.run_id, sample.layer())) {
          continue;
        }
        ++evaluations;
        const double value = layer.latest.value[metric];
        if (step_rule(rule, layer.rules[r], value)) {
          Escalation escalation;
          if (rule.backend != v1::BACKEND_UNSPECIFIED) {
            escalation = choose_backend(rule.backend, layer.correcting_backends);
            if (escalation.backend != v1::BACKEND_UNSPECIFIED && layer.desired == escalation.backend) {
              continue;
            }
          }
          firings.push_back({r, sample.layer(), value, sample.step(), std::move(escalation)});
        }
      }
    }
    counters_.rule_evaluations_total.Increment(static_cast<double>(evaluations));
  }
  counters_.observe(ages);
  if (skewed > 0) counters_.samples_clock_skew_total.Increment(static_cast<double>(skewed));
  counters_.samples_received_total.Increment(static_cast<double>(admitted));
  if (admitted < samples) {
    counters_.samples_shed_total[static_cast<std::size_t>(ShedReason::kRateLimit)]->Increment(
        static_cast<double>(samples - admitted));
  }
  for (const auto& firing : firings) fire(session, firing);
  return {};
}

Verdict Controller::on_goodbye(Session& session, const v1::Goodbye& goodbye) {
  if (goodbye.reason().size() > config_.limits.max_string_bytes) {
    return count({RejectReason::kString, "goodbye.reason longer than max_string_bytes"}, 0);
  }
  {
    std::lock_guard lock(session.rank->mu);
    if (session.rank->session_id == session.id()) session.rank->finished = true;
  }
  events().info("rank finished: run={} rank={} session={} last_step={} reason='{}'",
                session.run_id, session.rank_index, session.id(), goodbye.last_step(),
                goodbye.reason());
  return {};
}

void Controller::fire(const Session& session, const Firing& firing) {
  const ThresholdRule& rule = rules_[firing.rule];
  counters_.rule_firings_total.Increment();
  char fired[256];
  std::snprintf(fired, sizeof fired, "rule %s: %s = %.6g at step %llu (threshold %.6g x%u)",
                rule.name.c_str(),
                std::string(reference::metric_spec(rule.metric).name).c_str(), firing.value,
                static_cast<unsigned long long>(firing.step), rule.threshold, rule.for_samples);
  const std::string detail =
      rule.backend == v1::BACKEND_UNSPECIFIED ? fired : std::string(fired) + "; " + firing.escalation.why;
  events().warn("rule fired: run={} rank={} layer={} {}", session.run_id, session.rank_index,
                firing.layer, detail);
  try {
    if (rule.backend != v1::BACKEND_UNSPECIFIED) {
      if (firing.escalation.backend == v1::BACKEND_UNSPECIFIED) {
        counters_.escalations_uncorrectable_total.Increment();
        events().error("layer not switched: run={} rank={} layer={}: {}", session.run_id,
                       session.rank_index, firing.layer, firing.escalation.why);
        audit(v1::AUDIT_KIND_RULE_FIRED, session.run_id, &session.rank_index, 0, 0, detail);
      } else {
        v1::Target target;
        target.set_run_id(session.run_id);
        if (rule.decision_scope == DecisionScope::kRank) target.set_rank(session.rank_index);
        target.add_layers(firing.layer);
        decide(v1::DECISION_SOURCE_RULE, rule.name, target, firing.escalation.backend, detail);
      }
    }
    if (rule.capture_count > 0) {
      audit(v1::AUDIT_KIND_RULE_FIRED, session.run_id, &session.rank_index, 0, 0, detail);
      std::shared_ptr<Session> live;
      {
        std::lock_guard lock(sessions_mu_);
        auto it = sessions_.find(session.id());
        if (it != sessions_.end()) live = it->second;
      }
      if (live) {
        v1::Command command;
        command.mutable_capture()->set_layer(firing.layer);
        command.mutable_capture()->set_count(rule.capture_count);
        command.set_reason(rule.name);
        send_to(*live, std::move(command), "capture layer " + std::to_string(firing.layer));
      }
    }
  } catch (const StoreError& e) {
    counters_.store_errors_total.Increment();
    events().error("rule {} fired but could not be stored: {}", rule.name, e.what());
  }
}

Controller::DecisionResult Controller::decide(v1::DecisionSource source, const std::string& rule,
                                              const v1::Target& target, v1::Backend backend,
                                              const std::string& reason,
                                              std::optional<std::uint64_t> effective_step) {
  v1::Decision decision;
  decision.set_unix_time_ns(unix_now_ns());
  decision.set_source(source);
  decision.set_rule(rule);
  *decision.mutable_target() = target;
  decision.set_backend(backend);
  decision.set_reason(reason);
  store_.add_decision(decision);
  book_.add(decision);
  // A run of several processes switches at one common step on every rank; a
  // single-process run (world size 1) switches at its next step boundary.
  const bool run_target = !target.all_runs() && !target.run_id().empty() && !target.has_rank();
  bool multi_rank = false;
  if (run_target) {
    for (const auto& entry : registry_.ranks()) {
      std::lock_guard lock(entry->mu);
      if (entry->run_id == target.run_id() && entry->hello.world_size() > 1) multi_rank = true;
    }
  }
  const bool run_wide = run_target && (multi_rank || (effective_step && *effective_step != 0));
  std::uint64_t step = 0;
  if (run_wide) {
    step = effective_step ? run_steps_.record_decision(decision.decision_id(), *effective_step)
                          : run_steps_.begin_decision(decision.decision_id(), target.run_id(), steady_now_ns());
  }
  if (auto* counter = counters_.decisions_total[static_cast<std::size_t>(source) & 3]) counter->Increment();
  events().warn("decision {}: {} -> {} by {}: {}{}", decision.decision_id(), target_text(target),
                backend_name(backend), rule, reason,
                step != 0 ? " (effective step " + std::to_string(step) + ")" : std::string());
  const std::uint32_t target_rank = target.rank();
  const std::uint32_t* rank = target.has_rank() ? &target_rank : nullptr;
  audit(source == v1::DECISION_SOURCE_ADMIN ? v1::AUDIT_KIND_ADMIN : v1::AUDIT_KIND_RULE_FIRED,
        target.all_runs() ? "*" : target.run_id(), rank, 0, decision.decision_id(),
        std::string(backend_name(backend)) + ": " + reason +
            (step != 0 ? " (effective step " + std::to_string(step) + ")" : std::string()));

  for (const auto& entry : registry_.ranks()) {
    std::lock_guard lock(entry->mu);
    if (!target_covers_rank(target, entry->run_id, entry->rank)) continue;
    for (std::uint32_t i = 0; i < entry->layers.size(); ++i) {
      if (target_covers(target, entry->run_id, entry->rank, i)) entry->layers[i].desired = backend;
    }
  }
  DecisionResult result;
  result.decision_id = decision.decision_id();
  for (const auto& session : sessions()) {
    if (!target_covers_rank(target, session->run_id, session->rank_index)) continue;
    std::vector<std::uint32_t> layers;
    for (std::uint32_t i = 0; i < session->layer_count; ++i) {
      if (target_covers(target, session->run_id, session->rank_index, i)) layers.push_back(i);
    }
    if (layers.empty()) continue;
    if (send_switch(*session, std::move(layers), backend, decision.decision_id(), reason, step)) {
      ++result.commands_sent;
    }
  }
  return result;
}

std::uint32_t Controller::send_command(const v1::Target& target, const v1::Command& command,
                                       const std::string& who) {
  const bool capture = command.has_capture();
  const std::string what = capture ? "capture layer " + std::to_string(command.capture().layer()) +
                                         " x" + std::to_string(command.capture().count())
                                   : std::string("set sampling");
  const std::uint32_t target_rank = target.rank();
  audit(v1::AUDIT_KIND_ADMIN, target.all_runs() ? "*" : target.run_id(),
        target.has_rank() ? &target_rank : nullptr, 0, 0, what + " by " + who);
  std::uint32_t sent = 0;
  for (const auto& session : sessions()) {
    if (!target_covers_rank(target, session->run_id, session->rank_index)) continue;
    if (capture && command.capture().layer() >= session->layer_count) continue;
    if (send_to(*session, command, what)) ++sent;
  }
  return sent;
}

bool Controller::send_to(Session& session, v1::Command command, const std::string& what) {
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
  try {
    audit(v1::AUDIT_KIND_COMMAND_SENT, session.run_id, &session.rank_index, id, decision_id, what);
  } catch (const StoreError&) {
    counters_.store_errors_total.Increment();
  }
  return true;
}

bool Controller::send_switch(Session& session, std::vector<std::uint32_t> layers,
                             v1::Backend backend, std::uint64_t decision_id,
                             const std::string& reason, std::uint64_t effective_step) {
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

Verdict Controller::on_ack(Session& session, const v1::CommandAck& ack) {
  if (Verdict v = validate_ack(ack); !v.ok()) return count(v, 0);
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
  try {
    audit(applied ? v1::AUDIT_KIND_COMMAND_ACKED : v1::AUDIT_KIND_COMMAND_REJECTED, session.run_id,
          &session.rank_index, ack.command_id(), command ? command->decision_id() : 0, detail);
  } catch (const StoreError&) {
    counters_.store_errors_total.Increment();
  }
  if (command && !applied && command->has_switch_backend() && command->switch_backend().effective_step() != 0 &&
      ack.rank_step() >= command->switch_backend().effective_step()) {
    reissue_late_switch(session, *command, ack.rank_step());
  }
  return {};
}

void Controller::reissue_late_switch(const Session& session, const v1::Command& command, std::uint64_t rank_step) {
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

void Controller::close_session(Session& session) {
  const std::size_t dropped = session.close();
  counters_.commands_dropped_total.Increment(static_cast<double>(dropped));
  bool was_registered = false;
  {
    std::lock_guard lock(sessions_mu_);
    was_registered = sessions_.erase(session.id()) > 0;
  }
  if (was_registered) {
    counters_.trainers_connected.Decrement();
    registry_.disconnect(*session.rank, session.id());
    events().info("trainer disconnected: run={} rank={} session={}", session.run_id,
                  session.rank_index, session.id());
  }
}

std::vector<std::shared_ptr<Session>> Controller::sessions() const {
  std::lock_guard lock(sessions_mu_);
  std::vector<std::shared_ptr<Session>> out;
  out.reserve(sessions_.size());
  for (const auto& [id, session] : sessions_) out.push_back(session);
  return out;
}

void Controller::audit(v1::AuditKind kind, const std::string& run_id, const std::uint32_t* rank,
                       std::uint64_t command_id, std::uint64_t decision_id, std::string detail) {
  v1::AuditRecord record;
  record.set_unix_time_ns(unix_now_ns());
  record.set_kind(kind);
  record.set_run_id(run_id);
  if (rank != nullptr) record.set_rank(*rank);
  record.set_command_id(command_id);
  record.set_decision_id(decision_id);
  record.set_detail(std::move(detail));
  store_.add_audit(record);
}

void Controller::expire_ranks() {
  const auto expiry_ns = static_cast<std::int64_t>(config_.rank_expiry_seconds * 1e9);
  const std::size_t expired = registry_.expire(steady_now_ns(), expiry_ns);
  if (expired > 0) {
    counters_.ranks_expired_total.Increment(static_cast<double>(expired));
    events().warn("{} rank(s) expired: silent for {} s", expired, config_.rank_expiry_seconds);
  }
}

void Controller::enforce_retention() {
  RetentionPolicy policy;
  policy.audit_max_rows = config_.audit_max_rows;
  policy.audit_max_age_ns = static_cast<std::int64_t>(config_.audit_max_age_seconds * 1e9);
  policy.decision_history = config_.decision_history;
  try {
    const PruneResult result = store_.prune(policy, unix_now_ns());
    const auto audit = static_cast<std::size_t>(StoreTable::kAudit);
    const auto decisions = static_cast<std::size_t>(StoreTable::kDecisions);
    counters_.store_pruned_rows_total[audit]->Increment(static_cast<double>(result.audit_deleted));
    counters_.store_pruned_rows_total[decisions]->Increment(
        static_cast<double>(result.decisions_deleted));
    counters_.store_rows[audit]->Set(static_cast<double>(result.audit_rows));
    counters_.store_rows[decisions]->Set(static_cast<double>(result.decision_rows));
    counters_.retention_runs_total.Increment();
  } catch (const StoreError& e) {
    counters_.store_errors_total.Increment();
    events().error("retention pass failed: {}", e.what());
  }
}

void Controller::status(v1::GetStatusResponse& out) const {
  out.set_agent_version(std::string(kAgentVersion));
  out.set_start_unix_time_ns(start_unix_ns_);
  std::string last_run;
  std::uint32_t runs = 0;
  std::uint32_t connected = 0;
  std::uint32_t expired = 0;
  for (const auto& entry : registry_.ranks()) {
    std::lock_guard lock(entry->mu);
    if (entry->run_id != last_run) {
      ++runs;
      last_run = entry->run_id;
    }
    connected += entry->connected ? 1 : 0;
    expired += entry->expired ? 1 : 0;
  }
  out.set_runs(runs);
  out.set_ranks_connected(connected);
  out.set_ranks_expired(expired);
  out.set_samples_received_total(static_cast<std::uint64_t>(counters_.samples_received_total.Value()));
  out.set_samples_rejected_total(static_cast<std::uint64_t>(counters_.samples_rejected_total.Value()));
  std::uint64_t shed = 0;
  for (const auto* reason : counters_.samples_shed_total) shed += static_cast<std::uint64_t>(reason->Value());
  out.set_samples_shed_total(shed);
  out.set_decisions_total(book_.size());
  out.set_rules(static_cast<std::uint32_t>(rules_.size()));
  out.set_grpc_listen(config_.grpc_socket.empty() ? config_.tcp_listen
                                                  : "unix:" + config_.grpc_socket +
                                                        (config_.tcp_listen.empty()
                                                             ? ""
                                                             : " tcp:" + config_.tcp_listen));
  out.set_http_listen(config_.http_listen);
  out.set_database(config_.database);
}

void Controller::list_runs(const v1::ListRunsRequest& request, v1::ListRunsResponse& out) const {
  registry_.list(request, out);
}

void Controller::list_decisions(const v1::ListDecisionsRequest& request,
                                v1::ListDecisionsResponse& out) const {
  for (auto& decision : store_.decisions(request.run_id(), request.limit())) {
    *out.add_decisions() = std::move(decision);
  }
  if (request.include_audit()) {
    for (auto& record : store_.audit(request.run_id(), request.limit())) {
      *out.add_audit() = std::move(record);
    }
  }
}

}  // namespace gaugewatch::agent
