#pragma once
// The reporter's conversions between the hooks' plain messages
// (agent_messages.h) and the wire (gaugewatch.v1): the only place in the
// hooks that knows the proto types. Backend numbers go through the backend
// table (agent/common/backend_names.h), metric fields through the catalogue's
// field table, resolved once (agent/state/metric_fields.h).

#include "gaugewatch/v1/hook_service.pb.h"
#include "hooks/agent_messages.h"

namespace gaugewatch::hooks {

// Metrics that are not reportable (NaN, negative) are left unset.
gaugewatch::v1::Sample to_wire(const SampleData& sample);
gaugewatch::v1::Hello to_wire(const HelloInfo& hello);
gaugewatch::v1::CommandAck to_wire(const CommandAck& ack);
gaugewatch::v1::SamplingPolicy to_wire(const SamplingPolicy& policy);
// A command the hooks cannot read (an unknown backend number, no action)
// comes back with `malformed` set or without an action: the runtime rejects it.
Command from_wire(const gaugewatch::v1::Command& command);
SamplingPolicy from_wire(const gaugewatch::v1::SamplingPolicy& policy);
// Coverage into a batch: the call totals and the layer statuses in `coverage`.
void add_coverage(const CoverageReport& coverage, gaugewatch::v1::SampleBatch& batch);

}  // namespace gaugewatch::hooks
