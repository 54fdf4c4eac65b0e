#pragma once
// Switch decisions: what admins, threshold rules and PromQL rules ask for
// becomes a stored decision (SQLite, then the in-memory book), the layers'
// desired backend, an effective step for a run-wide switch, an audit record
// and a switch command to every connected trainer it covers. Also restores
// the decisions in force on a trainer that reconnects, and acts on sample
// rule firings (switch, report an uncorrectable layer, capture).

#include <cstdint>
#include <optional>
#include <string>

#include "agent/rules/rule.h"
#include "agent/rules/run_steps.h"
#include "agent/server/audit_trail.h"
#include "agent/server/command_fanout.h"
#include "agent/server/session.h"
#include "agent/state/agent_counters.h"
#include "agent/state/decision_book.h"
#include "agent/state/run_registry.h"
#include "agent/store/decision_store.h"

namespace gaugewatch::agent {

struct DecisionResult {
  std::uint64_t decision_id = 0;
  std::uint32_t commands_sent = 0;
};

class DecisionMaker : public DecisionSink {
 public:
  DecisionMaker(DecisionStore& store, DecisionBook& book, RunRegistry& registry, RunSteps& run_steps,
                CommandFanout& fanout, AuditTrail& audit, AgentCounters& counters)
      : store_(store), book_(book), registry_(registry), run_steps_(run_steps), fanout_(fanout),
        audit_(audit), counters_(counters) {}

  // Records the decision and sends it to every connected trainer it covers.
  // Throws StoreError if it cannot be stored (nothing is sent then). A
  // decision for a whole run (run id, no rank) of several processes takes
  // effect at one step on every rank: the request's effective step when
  // given (a fleet decision), else the step RunSteps picks from this agent's
  // ranks (docs/scaling.md, "Run-consistent switching").
  DecisionResult record(const DecisionRequest& request);
  void decide(const DecisionRequest& request) override { record(request); }

  // Acts on a sample rule's firing: logs and counts it, then records its
  // switch (or reports the layer as uncorrectable) and sends its capture to
  // `origin`, the stream whose sample fired. A store error is counted and
  // logged, never thrown.
  void act_on(const RuleFiring& firing, const Session& origin);

  // Sets the desired backend of a newly connected trainer's layers from the
  // book and re-sends every switch whose backend differs from what the layer
  // runs now.
  void restore(Session& session);

 private:
  DecisionStore& store_;
  DecisionBook& book_;
  RunRegistry& registry_;
  RunSteps& run_steps_;
  CommandFanout& fanout_;
  AuditTrail& audit_;
  AgentCounters& counters_;
};

}  // namespace gaugewatch::agent
