#pragma once
// One connected trainer: its rank entry and the queue of messages waiting to
// be written to its stream (drained by the stream's writer thread).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "agent/server/token_bucket.h"
#include "agent/state/run_registry.h"
#include "gaugewatch/v1/hook_service.pb.h"

namespace gaugewatch::agent {

class Session {
 public:
  static constexpr std::size_t kMaxOutbox = 4096;

  // rate <= 0: no limit on incoming samples.
  Session(std::uint64_t id, double sample_rate, double sample_burst, std::int64_t now_ns)
      : sample_bucket(sample_rate, sample_burst, now_ns), id_(id) {}

  std::uint64_t id() const { return id_; }

  // Queues a message; false if the session is closed or its outbox is full.
  bool push(gaugewatch::v1::AgentMessage message);
  // Blocks until a message is queued (true) or the session closes (false).
  bool pop(gaugewatch::v1::AgentMessage& out);
  // Wakes the writer; returns the number of messages that will not be sent.
  std::size_t close();

  // Set once by the Hello (read under no lock afterwards by the stream thread).
  bool hello_done = false;
  std::shared_ptr<RankEntry> rank;
  std::string run_id;
  std::uint32_t rank_index = 0;
  std::uint32_t layer_count = 0;
  // Incoming samples of this stream (read by its reader thread only).
  TokenBucket sample_bucket;

  // Who opened the stream (gRPC peer, with uid and pid for unix-socket callers).
  std::string peer;

  // Commands sent on this session and not yet acknowledged.
  std::mutex pending_mu;
  std::map<std::uint64_t, gaugewatch::v1::Command> pending;

 private:
  const std::uint64_t id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<gaugewatch::v1::AgentMessage> outbox_;
  bool closed_ = false;
};

}  // namespace gaugewatch::agent
