#include "agent/server/message_validator.h"

#include <cmath>

#include "agent/common/backend_names.h"
#include "agent/state/metric_fields.h"

namespace gaugewatch::agent {

namespace {

using gaugewatch::v1::Backend;

Verdict reject(RejectReason reason, std::string detail) { return {reason, std::move(detail)}; }

bool printable(std::string_view text) {
  for (unsigned char ch : text) {
    if (ch < 0x20 || ch == 0x7f) return false;
  }
  return true;
}

Verdict check_string(std::string_view text, std::string_view field, const Limits& limits) {
  if (text.size() > limits.max_string_bytes) {
    return reject(RejectReason::kString, std::string(field) + " longer than " +
                                             std::to_string(limits.max_string_bytes) + " bytes");
  }
  if (!printable(text)) {
    return reject(RejectReason::kString, std::string(field) + " has control characters");
  }
  return {};
}

bool known_backend(Backend backend) { return parse_backend(backend_name(backend)).has_value(); }

}  // namespace

Verdict validate_hello(const gaugewatch::v1::Hello& hello, const Limits& limits) {
  if (hello.protocol_version() != gaugewatch::v1::PROTOCOL_VERSION_1) {
    return reject(RejectReason::kProtocolVersion,
                  "protocol_version " + std::to_string(hello.protocol_version()) +
                      " not spoken; this agent speaks 1");
  }
  if (!is_label_safe(hello.run_id(), limits.max_run_id_bytes)) {
    return reject(RejectReason::kRunId, "run_id must match [A-Za-z0-9_.:-]{1," +
                                            std::to_string(limits.max_run_id_bytes) + "}");
  }
  if (hello.world_size() == 0 || hello.world_size() > limits.max_world_size) {
    return reject(RejectReason::kRank, "world_size must be in [1, " +
                                           std::to_string(limits.max_world_size) + "]");
  }
  if (hello.rank() >= hello.world_size()) {
    return reject(RejectReason::kRank, "rank " + std::to_string(hello.rank()) +
                                           " >= world_size " + std::to_string(hello.world_size()));
  }
  if (hello.local_rank() >= hello.world_size()) {
    return reject(RejectReason::kRank, "local_rank must be < world_size");
  }
  for (auto [text, field] : {std::pair<std::string_view, std::string_view>{hello.host(), "host"},
                             {hello.torch_version(), "torch_version"},
                             {hello.cuda_version(), "cuda_version"},
                             {hello.driver_version(), "driver_version"},
                             {hello.hook_version(), "hook_version"},
                             {hello.gpu_uuid(), "gpu_uuid"},
                             {hello.pci_bus_id(), "pci_bus_id"}}) {
    if (Verdict v = check_string(text, field, limits); !v.ok()) return v;
  }
  if (hello.layers_size() == 0) return reject(RejectReason::kLayers, "hello lists no layers");
  if (static_cast<std::uint32_t>(hello.layers_size()) > limits.max_layers) {
    return reject(RejectReason::kLayers, "hello lists " + std::to_string(hello.layers_size()) +
                                             " layers; limit " + std::to_string(limits.max_layers));
  }
  for (int i = 0; i < hello.layers_size(); ++i) {
    const auto& layer = hello.layers(i);
    if (layer.index() != static_cast<std::uint32_t>(i)) {
      return reject(RejectReason::kLayers, "layers[" + std::to_string(i) + "].index is " +
                                               std::to_string(layer.index()) + "; must be " +
                                               std::to_string(i));
    }
    if (Verdict v = check_string(layer.name(), "layers[].name", limits); !v.ok()) return v;
    if (!known_backend(layer.backend())) {
      return reject(RejectReason::kBackend,
                    "layers[" + std::to_string(i) + "].backend is not a known backend");
    }
  }
  return {};
}

namespace {

Verdict check_backends(const google::protobuf::RepeatedField<int>& backends, const std::string& where) {
  if (backends.size() > 8) return reject(RejectReason::kBackend, where + ": more than 8 correcting backends");
  for (const int backend : backends) {
    if (!gaugewatch::v1::Backend_IsValid(backend) || backend == gaugewatch::v1::BACKEND_UNSPECIFIED) {
      return reject(RejectReason::kBackend,
                    where + ": correcting backend " + std::to_string(backend) + " is no backend");
    }
  }
  return {};
}

}  // namespace

Verdict validate_sample(const gaugewatch::v1::Sample& sample, std::uint32_t layer_count,
                        const Limits& limits) {
  if (sample.layer() >= layer_count) {
    return reject(RejectReason::kLayerIndex, "layer " + std::to_string(sample.layer()) +
                                                 " out of range [0, " +
                                                 std::to_string(layer_count) + ")");
  }
  if (!known_backend(sample.backend())) {
    return reject(RejectReason::kBackend, "sample backend is not a known backend");
  }
  if (Verdict v = check_backends(sample.correcting_backends(), "correcting_backends"); !v.ok()) return v;
  const MetricValues metrics = to_values(sample.metrics());
  for (std::size_t i = 0; i < reference::kMetricCount; ++i) {
    if (!metrics.present.test(i)) continue;
    const double value = metrics.value[i];
    if (!std::isfinite(value) || value < 0.0) {
      return reject(RejectReason::kMetric,
                    "metric " + metric_fields()[i]->name() + " must be finite and >= 0");
    }
  }
  const auto& shape = sample.shape();
  for (std::uint32_t dim : {shape.batch(), shape.query_heads(), shape.key_value_heads(),
                            shape.query_len(), shape.key_len(), shape.head_dim()}) {
    if (dim > limits.max_shape_dim) return reject(RejectReason::kShape, "shape dimension too large");
  }
  if (shape.key_value_heads() != 0 &&
      (shape.query_heads() == 0 || shape.query_heads() % shape.key_value_heads() != 0)) {
    return reject(RejectReason::kShape, "key_value_heads must divide query_heads");
  }
  if (Verdict v = check_string(shape.dtype(), "shape.dtype", limits); !v.ok()) {
    v.reason = RejectReason::kShape;
    return v;
  }
  const auto& t = sample.timings();
  for (double value : {t.backward_us(), t.audit_us(), t.queue_us()}) {
    if (!std::isfinite(value) || value < 0.0) {
      return reject(RejectReason::kTiming, "timings must be finite and >= 0");
    }
  }
  return {};
}

Verdict validate_batch(const gaugewatch::v1::SampleBatch& batch, std::uint32_t layer_count,
                       const Limits& limits) {
  // A batch with nothing but the step is the hooks' heartbeat (docs/scaling.md).
  if (batch.samples_size() == 0 && batch.attention_calls_size() == 0 && batch.layer_status_size() == 0 &&
      batch.current_step() == 0) {
    return reject(RejectReason::kBatchSize, "empty sample batch");
  }
  if (static_cast<std::uint32_t>(batch.layer_status_size()) > layer_count) {
    return reject(RejectReason::kLayers, "layer_status of " + std::to_string(batch.layer_status_size()) +
                                             " entries for " + std::to_string(layer_count) + " layers");
  }
  for (int i = 0; i < batch.layer_status_size(); ++i) {
    const auto& status = batch.layer_status(i);
    const std::string where = "layer_status[" + std::to_string(i) + "]";
    if (status.layer() >= layer_count) {
      return reject(RejectReason::kLayerIndex, where + ".layer " + std::to_string(status.layer()) +
                                                   " >= the Hello's " + std::to_string(layer_count) + " layers");
    }
    if (Verdict v = check_string(status.reason(), "layer_status[].reason", limits); !v.ok()) return v;
    if (Verdict v = check_backends(status.correcting_backends(), where); !v.ok()) return v;
  }
  if (batch.attention_calls_size() > 64) {
    return reject(RejectReason::kBatchSize, "more than 64 attention_calls rows");
  }
  for (const auto& calls : batch.attention_calls()) {
    if (calls.reason().size() > 64 || !(calls.reason().empty() || is_label_safe(calls.reason(), 64))) {
      return reject(RejectReason::kString, "attention_calls[].reason must match [A-Za-z0-9_.:-]{0,64}");
    }
  }
  if (static_cast<std::uint32_t>(batch.samples_size()) > limits.max_batch_samples) {
    return reject(RejectReason::kBatchSize,
                  "batch of " + std::to_string(batch.samples_size()) + " samples; limit " +
                      std::to_string(limits.max_batch_samples));
  }
  for (int i = 0; i < batch.samples_size(); ++i) {
    Verdict v = validate_sample(batch.samples(i), layer_count, limits);
    if (!v.ok()) {
      v.detail = "samples[" + std::to_string(i) + "]: " + v.detail;
      return v;
    }
  }
  return {};
}

Verdict validate_ack(const gaugewatch::v1::CommandAck& ack) {
  if (ack.command_id() == 0) return reject(RejectReason::kAck, "ack without command_id");
  if (ack.status() != gaugewatch::v1::ACK_STATUS_APPLIED &&
      ack.status() != gaugewatch::v1::ACK_STATUS_REJECTED) {
    return reject(RejectReason::kAck, "ack status must be APPLIED or REJECTED");
  }
  if (ack.detail().size() > 4096) return reject(RejectReason::kAck, "ack detail too long");
  return {};
}

}  // namespace gaugewatch::agent
