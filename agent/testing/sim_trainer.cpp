#include "agent/testing/sim_trainer.h"

#include "agent/state/metric_fields.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

v1::Hello SimTrainer::make_hello(const std::string& run_id, std::uint32_t rank,
                                 std::uint32_t world_size, std::uint32_t layers) {
  v1::Hello hello;
  hello.set_protocol_version(v1::PROTOCOL_VERSION_1);
  hello.set_run_id(run_id);
  hello.set_rank(rank);
  hello.set_local_rank(rank % 8);
  hello.set_world_size(world_size);
  hello.set_host("sim-host");
  hello.set_pid(1000 + rank);
  hello.set_torch_version("2.11.0");
  hello.set_cuda_version("13.0");
  hello.set_driver_version("580.00");
  hello.set_hook_version("sim");
  for (std::uint32_t i = 0; i < layers; ++i) {
    auto* layer = hello.add_layers();
    layer->set_index(i);
    layer->set_name("model.layers." + std::to_string(i) + ".self_attn");
    layer->set_backend(v1::BACKEND_STOCK);
  }
  return hello;
}

v1::Sample SimTrainer::make_sample(std::uint64_t step, std::uint32_t layer, double dq) {
  v1::Sample sample;
  sample.set_step(step);
  sample.set_layer(layer);
  sample.set_backend(v1::BACKEND_STOCK);
  const auto& fields = metric_fields();
  auto* metrics = sample.mutable_metrics();
  for (std::size_t i = 0; i < fields.size(); ++i) {
    metrics->GetReflection()->SetDouble(metrics, fields[i], 0.001 * static_cast<double>(i + 1));
  }
  metrics->set_live_dq_discrepancy(dq);
  auto* shape = sample.mutable_shape();
  shape->set_batch(4);
  shape->set_query_heads(16);
  shape->set_key_value_heads(16);
  shape->set_query_len(4096);
  shape->set_key_len(4096);
  shape->set_head_dim(128);
  shape->set_is_causal(true);
  shape->set_dtype("bfloat16");
  sample.mutable_timings()->set_backward_us(1633);
  sample.mutable_timings()->set_audit_us(250);
  return sample;
}

SimTrainer::SimTrainer(std::shared_ptr<grpc::Channel> channel, v1::Hello hello,
                       std::string bearer_token)
    : stub_(v1::HookService::NewStub(std::move(channel))),
      hello_(std::move(hello)),
      bearer_token_(std::move(bearer_token)) {}

SimTrainer::~SimTrainer() {
  if (stream_ && !finished_) {
    context_.TryCancel();
  }
  if (reader_.joinable()) reader_.join();
  if (stream_ && !finished_) stream_->Finish();
}

bool SimTrainer::start(std::chrono::milliseconds timeout) {
  if (!bearer_token_.empty()) context_.AddMetadata("authorization", "Bearer " + bearer_token_);
  stream_ = stub_->Connect(&context_);
  v1::TrainerMessage message;
  *message.mutable_hello() = hello_;
  const bool wrote = stream_->Write(message);
  // The reader runs even if the write failed: it sees the end of the stream
  // (e.g. a refused call), so wait_end() reports the agent's status.
  reader_ = std::thread([this] { read_loop(); });
  if (!wrote) return false;
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [this] { return got_ack_ || ended_; }) && got_ack_;
}

void SimTrainer::read_loop() {
  v1::AgentMessage message;
  while (stream_->Read(&message)) {
    std::lock_guard lock(mu_);
    if (message.has_hello_ack()) {
      hello_ack_ = message.hello_ack();
      got_ack_ = true;
    } else if (message.has_command()) {
      commands_.push_back(message.command());
    }
    cv_.notify_all();
  }
  std::lock_guard lock(mu_);
  ended_ = true;
  cv_.notify_all();
}

bool SimTrainer::send(const v1::TrainerMessage& message) {
  std::lock_guard lock(write_mu_);
  return stream_->Write(message);
}

bool SimTrainer::send_batch(const v1::SampleBatch& batch) {
  v1::TrainerMessage message;
  *message.mutable_samples() = batch;
  return send(message);
}

bool SimTrainer::ack(std::uint64_t command_id, bool applied, std::uint64_t step) {
  v1::TrainerMessage message;
  auto* ack = message.mutable_ack();
  ack->set_command_id(command_id);
  ack->set_status(applied ? v1::ACK_STATUS_APPLIED : v1::ACK_STATUS_REJECTED);
  ack->set_applied_step(step);
  return send(message);
}

std::vector<v1::Command> SimTrainer::wait_commands(std::size_t n, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return commands_.size() >= n || ended_; });
  return commands_;
}

std::vector<v1::Command> SimTrainer::commands() {
  std::lock_guard lock(mu_);
  return commands_;
}

grpc::Status SimTrainer::finish() {
  {
    std::lock_guard lock(write_mu_);
    if (!writes_done_) stream_->WritesDone();
    writes_done_ = true;
  }
  if (reader_.joinable()) reader_.join();
  if (!finished_) {
    status_ = stream_->Finish();
    finished_ = true;
  }
  return status_;
}

grpc::Status SimTrainer::wait_end(std::chrono::milliseconds timeout) {
  {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return ended_; })) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "stream did not end");
    }
  }
  if (reader_.joinable()) reader_.join();
  if (!finished_) {
    status_ = stream_->Finish();
    finished_ = true;
  }
  return status_;
}

}  // namespace gaugewatch::agent
