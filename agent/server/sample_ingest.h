#pragma once
// Applies a validated sample batch to its rank's state: per-stream rate
// limit, step and attention-call reports, the layers' latest metrics and
// backends, the cardinality guard, the sample-age histogram, and every
// sample rule on every applied sample. The rank is locked once per batch;
// what rules fire is returned for the decision maker to act on after the
// lock is released.

#include <cstddef>
#include <memory>
#include <vector>

#include "agent/config/agent_config.h"
#include "agent/rules/rule.h"
#include "agent/rules/run_steps.h"
#include "agent/server/message_validator.h"
#include "agent/server/session.h"
#include "agent/state/agent_counters.h"
#include "agent/state/run_registry.h"
#include "gaugewatch/v1/hook_service.pb.h"

namespace gaugewatch::agent {

class SampleIngest {
 public:
  SampleIngest(const AgentConfig& config, const std::vector<std::unique_ptr<SampleRule>>& rules,
               RunRegistry& registry, RunSteps& run_steps, AgentCounters& counters)
      : config_(config), rules_(rules), registry_(registry), run_steps_(run_steps), counters_(counters) {}

  // Applies `batch` (validated for the session) and appends rule firings to
  // `fired`. A verdict other than ok: the stream was superseded by a newer
  // connection of the same rank, nothing was applied.
  Verdict apply(Session& session, const gaugewatch::v1::SampleBatch& batch, std::vector<RuleFiring>& fired);

 private:
  const AgentConfig& config_;
  const std::vector<std::unique_ptr<SampleRule>>& rules_;
  RunRegistry& registry_;
  RunSteps& run_steps_;
  AgentCounters& counters_;
};

}  // namespace gaugewatch::agent
