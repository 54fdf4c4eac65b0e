#include "agent/server/controller.h"

#include "agent/common/backend_names.h"
#include "agent/common/clock.h"
#include "agent/common/event_log.h"
#include "agent/rules/threshold_rule.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

Controller::Controller(const AgentConfig& config, DecisionStore& store, AgentCounters& counters)
    : config_(config),
      rules_(make_sample_rules(config)),
      store_(store),
      counters_(counters),
      registry_(config.max_series, rules_.size(), config.limits.max_ranks),
      audit_(store, counters),
      fanout_(store.max_command_id(), counters, audit_, run_steps_),
      decisions_(store, book_, registry_, run_steps_, fanout_, audit_, counters),
      ingest_(config_, rules_, registry_, run_steps_, counters),
      queries_(config_, registry_, store, book_, counters, rules_.size(), unix_now_ns()) {
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
  fanout_.add(shared);
  counters_.trainers_connected.Increment();
  // The decisions in force that cover this trainer.
  decisions_.restore(session);
  return {};
}

Verdict Controller::on_batch(Session& session, const v1::SampleBatch& batch) {
  const auto samples = static_cast<std::size_t>(batch.samples_size());
  if (Verdict v = validate_batch(batch, session.layer_count, config_.limits); !v.ok()) {
    return count(v, samples);
  }
  std::vector<RuleFiring> fired;
  if (Verdict v = ingest_.apply(session, batch, fired); !v.ok()) return count(v, samples);
  for (const auto& firing : fired) decisions_.act_on(firing, session);
  return {};
}

Verdict Controller::on_ack(Session& session, const v1::CommandAck& ack) {
  if (Verdict v = validate_ack(ack); !v.ok()) return count(v, 0);
  fanout_.acknowledge(session, ack);
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

void Controller::close_session(Session& session) {
  const std::size_t dropped = session.close();
  counters_.commands_dropped_total.Increment(static_cast<double>(dropped));
  if (fanout_.remove(session.id())) {
    counters_.trainers_connected.Decrement();
    registry_.disconnect(*session.rank, session.id());
    events().info("trainer disconnected: run={} rank={} session={}", session.run_id,
                  session.rank_index, session.id());
  }
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

}  // namespace gaugewatch::agent
