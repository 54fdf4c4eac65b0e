#pragma once
// The reporter: a background thread holding one gRPC bidi stream
// (gaugewatch.v1.HookService/Connect) to the node agent over its unix socket.
// Hello (run, rank, versions, layers) -> HelloAck; then sample batches and
// command acks go out, commands come in (handed to the Source, which applies
// them at the next step boundary). Reconnects with exponential backoff
// (100 ms doubling to GAUGEWATCH_RECONNECT_MAX_MS, with jitter); a changed
// layer table also reconnects (the agent takes one Hello per stream).
// Samples wait in a bounded queue: when it is full the oldest is dropped and
// counted; the count travels in every SampleBatch (dropped_total).
// Every batch carries the step the process runs (current_step); while steps
// advance and no samples go out, a batch without samples says it at least
// once per kHeartbeat (the agent's step clock, docs/scaling.md).
// The queue holds plain C++ samples and acks (agent_messages.h): the
// reporter alone converts them to gaugewatch.v1 messages, and the agent's
// messages to plain commands (reporter_wire.h), on its own thread.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "hooks/agent_messages.h"
#include "hooks/config.h"

namespace gaugewatch::hooks {

class Reporter {
 public:
  class Source {
   public:
    virtual ~Source() = default;
    virtual HelloInfo hello() = 0;
    virtual std::uint64_t layers_version() = 0;
    // The step the process is running (SampleBatch.current_step).
    virtual std::uint64_t current_step() = 0;
    // Coverage totals and the layers changed after version `since` (0: all).
    virtual CoverageReport coverage(std::uint64_t since) = 0;
    virtual void on_command(Command command) = 0;
    virtual void on_sampling(const SamplingPolicy& policy) = 0;
  };

  Reporter(const HookConfig& config, Source* source);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  void enqueue_sample(SampleData sample);
  void enqueue_ack(CommandAck ack);
  // Waits until every queued sample and ack was written (or timeout).
  bool flush(double timeout_s);
  // Stops the thread: a connected reporter says Goodbye within half of
  // `timeout_s`, then the stream is cancelled and the thread joined (waiting
  // up to 5 s for a loaded machine to schedule it; detached, and logged, only
  // past that).
  void stop(double timeout_s);

  std::uint64_t sent() const { return sent_.load(); }
  std::uint64_t dropped() const { return dropped_.load(); }
  std::uint64_t connects() const { return connects_.load(); }
  std::uint64_t commands_received() const { return commands_.load(); }
  bool connected() const { return connected_.load(); }

 private:
  struct Impl;
  void run();
  void say_goodbye(Impl& impl);  // the last message of a clean stop

  HookConfig config_;
  Source* source_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<SampleData> samples_;
  std::deque<CommandAck> acks_;
  std::size_t in_flight_ = 0;
  bool stopping_ = false;
  bool exited_ = false;
  std::atomic<std::uint64_t> sent_{0};
  std::atomic<std::uint64_t> dropped_{0};
  std::atomic<std::uint64_t> connects_{0};
  std::atomic<std::uint64_t> commands_{0};
  std::atomic<bool> connected_{false};
  std::shared_ptr<Impl> impl_;  // the live stream, for cancellation
  std::thread thread_;
};

}  // namespace gaugewatch::hooks
