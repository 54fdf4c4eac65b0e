#include "agent/server/decision_maker.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "agent/common/backend_names.h"
#include "agent/common/clock.h"
#include "agent/common/event_log.h"

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

DecisionResult DecisionMaker::record(const DecisionRequest& request) {
  const v1::Target& target = request.target;
  v1::Decision decision;
  decision.set_unix_time_ns(unix_now_ns());
  decision.set_source(request.source);
  decision.set_rule(request.rule);
  *decision.mutable_target() = target;
  decision.set_backend(request.backend);
  decision.set_reason(request.reason);
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
  const auto& effective_step = request.effective_step;
  const bool run_wide = run_target && (multi_rank || (effective_step && *effective_step != 0));
  std::uint64_t step = 0;
  if (run_wide) {
    step = effective_step ? run_steps_.record_decision(decision.decision_id(), *effective_step)
                          : run_steps_.begin_decision(decision.decision_id(), target.run_id(), steady_now_ns());
  }
  if (auto* counter = counters_.decisions_total[static_cast<std::size_t>(request.source) & 3]) counter->Increment();
  const std::string at_step = step != 0 ? " (effective step " + std::to_string(step) + ")" : std::string();
  events().warn("decision {}: {} -> {} by {}: {}{}", decision.decision_id(), target_text(target),
                backend_name(request.backend), request.rule, request.reason, at_step);
  const std::uint32_t target_rank = target.rank();
  audit_.record(request.source == v1::DECISION_SOURCE_ADMIN ? v1::AUDIT_KIND_ADMIN : v1::AUDIT_KIND_RULE_FIRED,
                target.all_runs() ? "*" : target.run_id(), target.has_rank() ? &target_rank : nullptr, 0,
                decision.decision_id(), std::string(backend_name(request.backend)) + ": " + request.reason + at_step);

  for (const auto& entry : registry_.ranks()) {
    std::lock_guard lock(entry->mu);
    if (!target_covers_rank(target, entry->run_id, entry->rank)) continue;
    for (std::uint32_t i = 0; i < entry->layers.size(); ++i) {
      if (target_covers(target, entry->run_id, entry->rank, i)) entry->layers[i].desired = request.backend;
    }
  }
  DecisionResult result;
  result.decision_id = decision.decision_id();
  result.commands_sent = fanout_.switch_target(target, request.backend, decision.decision_id(), request.reason, step);
  return result;
}

void DecisionMaker::act_on(const RuleFiring& firing, const Session& origin) {
  counters_.rule_firings_total.Increment();
  events().warn("rule fired: run={} rank={} layer={} {}", firing.run_id, firing.rank, firing.layer,
                firing.detail);
  try {
    if (firing.switches) {
      if (firing.backend == v1::BACKEND_UNSPECIFIED) {
        counters_.escalations_uncorrectable_total.Increment();
        events().error("layer not switched: run={} rank={} layer={}: {}", firing.run_id, firing.rank,
                       firing.layer, firing.detail);
        audit_.record(v1::AUDIT_KIND_RULE_FIRED, firing.run_id, &firing.rank, 0, 0, firing.detail);
      } else {
        record({v1::DECISION_SOURCE_RULE, firing.rule, firing.target, firing.backend, firing.detail, std::nullopt});
      }
    }
    if (firing.capture_count > 0) {
      audit_.record(v1::AUDIT_KIND_RULE_FIRED, firing.run_id, &firing.rank, 0, 0, firing.detail);
      if (auto live = fanout_.find(origin.id())) {
        v1::Command command;
        command.mutable_capture()->set_layer(firing.layer);
        command.mutable_capture()->set_count(firing.capture_count);
        command.set_reason(firing.rule);
        fanout_.send_to(*live, std::move(command), "capture layer " + std::to_string(firing.layer));
      }
    }
  } catch (const StoreError& e) {
    counters_.store_errors_total.Increment();
    events().error("rule {} fired but could not be stored: {}", firing.rule, e.what());
  }
}

void DecisionMaker::restore(Session& session) {
  std::map<v1::Backend, std::pair<std::vector<std::uint32_t>, std::uint64_t>> resend;
  {
    std::lock_guard lock(session.rank->mu);
    for (std::uint32_t i = 0; i < session.layer_count; ++i) {
      const auto desired = book_.desired(session.run_id, session.rank_index, i);
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
    fanout_.send_switch(session, std::move(group.first), backend, group.second, "restored decision on reconnect",
                        run_steps_.effective_step(group.second));
  }
}

}  // namespace gaugewatch::agent
