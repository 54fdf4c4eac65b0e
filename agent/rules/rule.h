#pragma once
// What the agent's rules see and what they propose. Rules never act
// themselves: a rule evaluated on ingested samples (SampleRule) returns a
// RuleFiring, a rule evaluated on a timer (the PromQL poller) hands a
// DecisionRequest to a DecisionSink; the agent's decision maker
// (agent/server/decision_maker.h) records, audits and sends what they
// propose. Nothing here depends on the transport.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "agent/state/metric_fields.h"
#include "agent/state/run_registry.h"
#include "gaugewatch/v1/admin_service.pb.h"

namespace gaugewatch::agent {

// A switch decision a rule asks for.
struct DecisionRequest {
  gaugewatch::v1::DecisionSource source = gaugewatch::v1::DECISION_SOURCE_UNSPECIFIED;
  std::string rule;  // the rule's name (or "admin <caller>")
  gaugewatch::v1::Target target;
  gaugewatch::v1::Backend backend = gaugewatch::v1::BACKEND_UNSPECIFIED;
  std::string reason;
  // A fleet decision's step, the same on every node; else the agent picks
  // one for a run-wide target (docs/scaling.md, "Run-consistent switching").
  std::optional<std::uint64_t> effective_step;
};

// Takes what rules propose. decide() throws StoreError when the decision
// cannot be stored (nothing is sent then).
class DecisionSink {
 public:
  virtual ~DecisionSink() = default;
  virtual void decide(const DecisionRequest& request) = 0;
};

// One applied sample, as a rule evaluated on ingestion sees it. Read under
// the rank's lock: rules must not block.
struct SampleView {
  const std::string& run_id;
  std::uint32_t rank = 0;
  std::uint32_t layer = 0;
  std::uint64_t step = 0;
  const LayerEntry& state;  // the layer after the sample was applied
};

// A sample rule fired: what to do about (run, rank, layer).
struct RuleFiring {
  std::string rule;
  std::string run_id;
  std::uint32_t rank = 0;
  std::uint32_t layer = 0;
  std::string detail;  // what fired and why this backend; goes to log, audit and decision
  // Switch: the target (this rank or the whole run, this layer) and the
  // backend escalation chose; switch_backend with BACKEND_UNSPECIFIED means
  // no correcting backend can take the layer (reported, not switched).
  bool switches = false;
  gaugewatch::v1::Target target;
  gaugewatch::v1::Backend backend = gaugewatch::v1::BACKEND_UNSPECIFIED;
  // Capture: this many samples of the layer from the stream that sent it.
  std::uint32_t capture_count = 0;
};

// A rule evaluated on every sample the agent applies. Its per-layer state
// lives in the layer (LayerEntry::rules[slot]), so ranks never share it.
class SampleRule {
 public:
  virtual ~SampleRule() = default;
  virtual const std::string& name() const = 0;
  // Evaluates one sample; false when the rule does not look at it (not in
  // its scope, or its metric absent). A firing is appended to `fired`.
  virtual bool evaluate(const SampleView& sample, RuleState& state,
                        std::vector<RuleFiring>& fired) const = 0;
};

}  // namespace gaugewatch::agent
