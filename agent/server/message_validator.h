#pragma once
// Validation of every message a trainer sends. A message either passes or
// yields a reason (exported as a counter label) and a human-readable detail
// that goes back to the trainer in the gRPC status.

#include <cstdint>
#include <string>
#include <string_view>

#include "agent/common/label_safe.h"
#include "agent/common/reject_reason.h"
#include "agent/config/agent_config.h"
#include "gaugewatch/v1/hook_service.pb.h"

namespace gaugewatch::agent {

struct Verdict {
  RejectReason reason = RejectReason::kNone;
  std::string detail;
  bool ok() const { return reason == RejectReason::kNone; }
};


Verdict validate_hello(const gaugewatch::v1::Hello& hello, const Limits& limits);
Verdict validate_sample(const gaugewatch::v1::Sample& sample, std::uint32_t layer_count,
                        const Limits& limits);
Verdict validate_batch(const gaugewatch::v1::SampleBatch& batch, std::uint32_t layer_count,
                       const Limits& limits);
Verdict validate_ack(const gaugewatch::v1::CommandAck& ack);

}  // namespace gaugewatch::agent
