#pragma once
// A simulated training process: a real gRPC client of HookService that says
// Hello, streams sample batches, collects the agent's commands and acks them.
// Used by the integration tests and the load benchmark.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gaugewatch/v1/hook_service.grpc.pb.h"

namespace gaugewatch::agent {

class SimTrainer {
 public:
  // A valid Hello with `layers` layers, all on the stock backend.
  static gaugewatch::v1::Hello make_hello(const std::string& run_id, std::uint32_t rank,
                                          std::uint32_t world_size, std::uint32_t layers);
  // A sample with every catalogue metric set (live_dq_discrepancy = dq).
  static gaugewatch::v1::Sample make_sample(std::uint64_t step, std::uint32_t layer, double dq);

  // `bearer_token` non-empty: sent as "authorization: Bearer <token>" (TCP).
  SimTrainer(std::shared_ptr<grpc::Channel> channel, gaugewatch::v1::Hello hello,
             std::string bearer_token = "");
  ~SimTrainer();
  SimTrainer(const SimTrainer&) = delete;
  SimTrainer& operator=(const SimTrainer&) = delete;

  // Sends the Hello and waits for the HelloAck. False if the stream failed.
  bool start(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  bool send(const gaugewatch::v1::TrainerMessage& message);
  bool send_batch(const gaugewatch::v1::SampleBatch& batch);
  bool ack(std::uint64_t command_id, bool applied, std::uint64_t step = 0);

  // Waits until at least `n` commands arrived; returns them all.
  std::vector<gaugewatch::v1::Command> wait_commands(std::size_t n,
                                                     std::chrono::milliseconds timeout);
  std::vector<gaugewatch::v1::Command> commands();
  const gaugewatch::v1::HelloAck& hello_ack() const { return hello_ack_; }

  // Half-closes and returns the stream's final status (waits for the agent).
  grpc::Status finish();
  // Waits for the agent to end the stream (e.g. after a rejected message).
  grpc::Status wait_end(std::chrono::milliseconds timeout);

 private:
  void read_loop();

  grpc::ClientContext context_;
  std::unique_ptr<gaugewatch::v1::HookService::Stub> stub_;
  std::unique_ptr<grpc::ClientReaderWriter<gaugewatch::v1::TrainerMessage,
                                           gaugewatch::v1::AgentMessage>>
      stream_;
  gaugewatch::v1::Hello hello_;
  std::string bearer_token_;
  gaugewatch::v1::HelloAck hello_ack_;
  std::mutex mu_;
  std::mutex write_mu_;
  std::condition_variable cv_;
  bool got_ack_ = false;
  bool ended_ = false;
  bool writes_done_ = false;
  bool finished_ = false;
  grpc::Status status_;
  std::vector<gaugewatch::v1::Command> commands_;
  std::thread reader_;
};

}  // namespace gaugewatch::agent
