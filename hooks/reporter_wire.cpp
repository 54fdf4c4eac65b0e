#include "hooks/reporter_wire.h"

#include <algorithm>
#include <cmath>

#include "agent/common/backend_names.h"
#include "agent/state/metric_fields.h"

namespace gaugewatch::hooks {

namespace v1 = gaugewatch::v1;

namespace {
double non_negative(double us) { return std::isfinite(us) ? std::max(0.0, us) : 0.0; }
}  // namespace

v1::Sample to_wire(const SampleData& d) {
  v1::Sample sample;
  sample.set_step(d.step);
  sample.set_layer(static_cast<std::uint32_t>(d.layer));
  sample.set_backend(agent::to_wire(d.backend));
  agent::MetricValues values;
  for (std::size_t i = 0; i < d.metrics.size(); ++i) {
    if (!reportable(d.metrics[i])) continue;
    values.value[i] = d.metrics[i];
    values.present.set(i);
  }
  agent::to_proto(values, *sample.mutable_metrics());
  auto* shape = sample.mutable_shape();
  shape->set_batch(d.batch);
  shape->set_query_heads(d.query_heads);
  shape->set_key_value_heads(d.key_value_heads);
  shape->set_query_len(d.query_len);
  shape->set_key_len(d.key_len);
  shape->set_head_dim(d.head_dim);
  shape->set_is_causal(d.is_causal);
  shape->set_dtype(d.dtype);
  auto* t = sample.mutable_timings();
  t->set_backward_us(non_negative(d.backward_us));
  t->set_audit_us(non_negative(d.audit_us));
  t->set_queue_us(non_negative(d.queue_us));
  sample.set_unix_time_ns(d.unix_time_ns);
  for (Backend b : d.correcting_backends) sample.add_correcting_backends(agent::to_wire(b));
  return sample;
}

void add_coverage(const CoverageReport& coverage, v1::SampleBatch& batch) {
  for (const AttentionCallCount& c : coverage.calls) {
    auto* count = batch.add_attention_calls();
    count->set_monitored(c.monitored);
    count->set_reason(c.reason);
    count->set_calls_total(c.calls);
  }
  for (const LayerStatus& l : coverage.layers) {
    auto* status = batch.add_layer_status();
    status->set_layer(l.layer);
    status->set_monitored(l.monitored);
    status->set_reason(l.reason);
    for (Backend b : l.correcting_backends) status->add_correcting_backends(agent::to_wire(b));
  }
}

v1::Hello to_wire(const HelloInfo& h) {
  v1::Hello hello;
  hello.set_protocol_version(v1::PROTOCOL_VERSION_1);
  hello.set_run_id(h.run_id);
  hello.set_rank(h.rank);
  hello.set_local_rank(h.local_rank);
  hello.set_world_size(h.world_size);
  hello.set_host(h.host.substr(0, 200));
  hello.set_pid(h.pid);
  hello.set_torch_version(h.torch_version);
  hello.set_cuda_version(h.cuda_version);
  hello.set_driver_version(h.driver_version);
  hello.set_hook_version(h.hook_version);
  hello.set_gpu_uuid(h.gpu_uuid);
  hello.set_pci_bus_id(h.pci_bus_id);
  for (const LayerInfo& l : h.layers) {
    auto* layer = hello.add_layers();
    layer->set_index(l.index);
    layer->set_name(l.name.substr(0, 200));
    layer->set_backend(agent::to_wire(l.backend));
  }
  return hello;
}

v1::CommandAck to_wire(const CommandAck& a) {
  v1::CommandAck ack;
  ack.set_command_id(a.command_id);
  ack.set_status(a.applied ? v1::ACK_STATUS_APPLIED : v1::ACK_STATUS_REJECTED);
  ack.set_applied_step(a.applied ? a.applied_step : 0);
  ack.set_detail(a.detail.substr(0, 4000));
  ack.set_rank_step(a.rank_step);
  return ack;
}

v1::SamplingPolicy to_wire(const SamplingPolicy& p) {
  v1::SamplingPolicy out;
  out.set_every_n_steps(p.every_n_steps);
  out.set_layer_fraction(p.layer_fraction);
  out.set_max_heads(p.max_heads);
  out.set_max_rows(p.max_rows);
  out.set_overhead_budget(p.overhead_budget);
  return out;
}

SamplingPolicy from_wire(const v1::SamplingPolicy& p) {
  SamplingPolicy out;
  out.every_n_steps = p.every_n_steps();
  out.layer_fraction = p.layer_fraction();
  out.max_heads = p.max_heads();
  out.max_rows = p.max_rows();
  out.overhead_budget = p.overhead_budget();
  return out;
}

Command from_wire(const v1::Command& c) {
  Command out;
  out.id = c.command_id();
  out.reason = c.reason();
  out.decision_id = c.decision_id();
  switch (c.action_case()) {
    case v1::Command::kSwitchBackend: {
      SwitchBackend sw;
      sw.layers.assign(c.switch_backend().layers().begin(), c.switch_backend().layers().end());
      const auto backend = agent::from_wire(c.switch_backend().backend());
      if (!backend) out.malformed = "unknown backend " + std::to_string(c.switch_backend().backend());
      sw.backend = backend.value_or(Backend::kStock);
      sw.effective_step = c.switch_backend().effective_step();
      out.action = std::move(sw);
      break;
    }
    case v1::Command::kSetSampling:
      out.action = from_wire(c.set_sampling());
      break;
    case v1::Command::kCapture:
      out.action = CaptureOperands{c.capture().layer(), c.capture().count()};
      break;
    default:
      break;
  }
  return out;
}

}  // namespace gaugewatch::hooks
