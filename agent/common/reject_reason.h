#pragma once
// Why a trainer message was rejected: the label of
// gaugewatch_agent_messages_rejected_total{reason} and the first word of the
// gRPC status the stream ends with.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gaugewatch::agent {

enum class RejectReason : std::uint8_t {
  kNone,
  kProtocolVersion,
  kOutOfOrder,  // no Hello first, a second Hello, an empty message
  kRunId,
  kRank,
  kString,
  kLayers,
  kBatchSize,
  kLayerIndex,
  kBackend,
  kMetric,
  kShape,
  kTiming,
  kAck,
  kUnparseable,  // bytes that are no TrainerMessage
  kTooLarge,     // over limits.max_message_bytes
  kCount,
};

inline constexpr std::size_t kRejectReasonCount = static_cast<std::size_t>(RejectReason::kCount);

constexpr std::string_view reject_reason_name(RejectReason reason) {
  switch (reason) {
    case RejectReason::kNone: return "none";
    case RejectReason::kProtocolVersion: return "protocol_version";
    case RejectReason::kOutOfOrder: return "out_of_order";
    case RejectReason::kRunId: return "run_id";
    case RejectReason::kRank: return "rank";
    case RejectReason::kString: return "string";
    case RejectReason::kLayers: return "layers";
    case RejectReason::kBatchSize: return "batch_size";
    case RejectReason::kLayerIndex: return "layer_index";
    case RejectReason::kBackend: return "backend";
    case RejectReason::kMetric: return "metric";
    case RejectReason::kShape: return "shape";
    case RejectReason::kTiming: return "timing";
    case RejectReason::kAck: return "ack";
    case RejectReason::kUnparseable: return "unparseable";
    case RejectReason::kTooLarge: return "too_large";
    case RejectReason::kCount: break;
  }
  return "unknown";
}

}  // namespace gaugewatch::agent
