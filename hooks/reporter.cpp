#include "hooks/reporter.h"

#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>
#include <utility>

#include "agent/state/metric_fields.h"
#include "gaugewatch/v1/hook_service.grpc.pb.h"
#include "hooks/log.h"
#include "hooks/reporter_wire.h"

namespace gaugewatch::hooks {

namespace v1 = gaugewatch::v1;
using namespace std::chrono_literals;

namespace {
constexpr std::size_t kMaxBatch = 256;
constexpr std::size_t kMaxAcks = 4096;
constexpr auto kHeartbeat = std::chrono::seconds(1);
constexpr auto kRestoreWindow = std::chrono::seconds(1);
// After the stream is cancelled its calls return at once, but a loaded
// machine may take a while to schedule the thread: stop() waits this long
// rather than leave it running into the process's teardown.
constexpr auto kCancelledStopWait = std::chrono::seconds(5);
}  // namespace

// One connection: the stream, its context, and the reader thread.
struct Reporter::Impl {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<v1::TrainerMessage, v1::AgentMessage>> stream;
  std::thread reader;
  std::atomic<bool> ended{false};
  std::atomic<bool> got_hello_ack{false};
  // The agent sends the decisions it holds for the run id right after its
  // HelloAck: commands read on the process's first connection within
  // kRestoreWindow of the HelloAck are taken as such restores (a rule's
  // decision needs this process's samples first).
  bool first_connection = false;
  std::chrono::steady_clock::time_point restore_until{};
};

Reporter::Reporter(const HookConfig& config, Source* source) : config_(config), source_(source) {
  // The metric catalogue's proto fields, resolved once here (it throws if
  // the catalogue and LayerMetrics disagree: a build error, said loudly).
  try {
    (void)agent::metric_fields();
  } catch (const std::exception& e) {
    log_line(std::string("metric catalogue and wire disagree, samples will lack metrics: ") + e.what());
  }
  thread_ = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), "gw-reporter");  // named in stack dumps
    run();
  });
}

Reporter::~Reporter() { stop(1.0); }

void Reporter::enqueue_sample(SampleData sample) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  if (samples_.size() >= config_.queue_size) {
    samples_.pop_front();
    dropped_.fetch_add(1);
    log_once("queue-full", "sample queue full (" + std::to_string(config_.queue_size) +
                               "): dropping the oldest samples, counted in dropped_total (logged once)");
  }
  samples_.push_back(std::move(sample));
  cv_.notify_all();
}

void Reporter::enqueue_ack(CommandAck ack) {
  std::lock_guard lock(mu_);
  if (stopping_) return;
  if (acks_.size() >= kMaxAcks) acks_.pop_front();
  acks_.push_back(std::move(ack));
  cv_.notify_all();
}

bool Reporter::flush(double timeout_s) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] {
    return (samples_.empty() && acks_.empty() && in_flight_ == 0) || exited_;
  }) && samples_.empty() && acks_.empty();
}

void Reporter::stop(double timeout_s) {
  std::shared_ptr<Impl> impl;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    impl = impl_;
    cv_.notify_all();
  }
  if (!thread_.joinable()) {
    if (impl) impl->context.TryCancel();
    return;
  }
  std::unique_lock lock(mu_);
  // A connected reporter ends its stream with a Goodbye (say_goodbye); past
  // half the time, or with no stream, the stream is cancelled.
  const auto grace = std::chrono::duration<double>(timeout_s / 2);
  if (!cv_.wait_for(lock, grace, [this] { return exited_; }) && impl) {
    lock.unlock();
    impl->context.TryCancel();
    lock.lock();
  }
  const auto rest = std::max<std::chrono::duration<double>>(std::chrono::duration<double>(timeout_s / 2),
                                                            kCancelledStopWait);
  if (cv_.wait_for(lock, rest, [this] { return exited_; })) {
    lock.unlock();
    thread_.join();
  } else {
    lock.unlock();
    log_line("reporter did not stop within " + std::to_string(timeout_s / 2 + rest.count()).substr(0, 4) +
             " s of the exit (its stream cancelled); leaving it");
    thread_.detach();
  }
}

void Reporter::say_goodbye(Impl& impl) {
  v1::TrainerMessage message;
  message.mutable_goodbye()->set_last_step(source_->current_step());
  message.mutable_goodbye()->set_reason("exit");
  if (!impl.stream->Write(message) || !impl.stream->WritesDone()) return;
  // The agent ends the stream once it has read the goodbye; wait for that
  // (bounded by stop()'s cancel) so that the teardown's cancel cannot drop it.
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, 500ms, [&] { return impl.ended.load(); });
}

void Reporter::run() {
  const std::string target = "unix:" + config_.socket;
  std::mt19937 rng(std::random_device{}());
  auto backoff = 100ms;
  const auto max_backoff = std::chrono::milliseconds(config_.reconnect_max_ms);
  std::uint64_t failures = 0;
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) break;
    }
    // --- connect ---------------------------------------------------------------
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(config_.reconnect_max_ms));
    auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
    // Up to 2 s, in slices, so that stop() is never kept waiting.
    bool ok = false;
    for (int i = 0; i < 10 && !ok; ++i) {
      ok = channel->WaitForConnected(std::chrono::system_clock::now() + 200ms);
      std::lock_guard lock(mu_);
      if (stopping_) break;
    }
    auto impl = std::make_shared<Impl>();
    impl->first_connection = connects_.load() == 0;
    const std::uint64_t version = source_->layers_version();
    std::uint64_t coverage_sent = 0;  // per connection: a new agent session gets every layer's status
    if (ok) {
      auto stub = v1::HookService::NewStub(channel);
      impl->stream = stub->Connect(&impl->context);
      v1::TrainerMessage hello;
      *hello.mutable_hello() = to_wire(source_->hello());
      ok = impl->stream->Write(hello);
      if (ok) {
        {
          std::lock_guard lock(mu_);
          impl_ = impl;
          if (stopping_) impl->context.TryCancel();
        }
        impl->reader = std::thread([this, impl] {
          ::pthread_setname_np(::pthread_self(), "gw-agent-read");
          v1::AgentMessage message;
          while (impl->stream->Read(&message)) {
            if (message.has_hello_ack()) {
              impl->got_hello_ack = true;
              impl->restore_until = std::chrono::steady_clock::now() + kRestoreWindow;
              source_->on_sampling(from_wire(message.hello_ack().sampling()));
            } else if (message.has_command()) {
              commands_.fetch_add(1);
              Command command = from_wire(message.command());
              command.restored = impl->first_connection && std::chrono::steady_clock::now() < impl->restore_until;
              source_->on_command(std::move(command));
            }
          }
          impl->ended = true;
          std::lock_guard lock(mu_);
          cv_.notify_all();
        });
      }
    }
    if (ok) {
      connects_.fetch_add(1);
      connected_ = true;
      log_line("connected to the agent at " + config_.socket + " (connection " + std::to_string(connects_.load()) +
               ")");
      failures = 0;
      backoff = 100ms;
      // --- stream -------------------------------------------------------------
      std::uint64_t reported_step = std::numeric_limits<std::uint64_t>::max();  // none yet on this stream
      auto last_batch = std::chrono::steady_clock::now() - kHeartbeat;
      bool goodbye = false;  // stopping with everything written: tell the agent this rank finished
      for (;;) {
        std::vector<CommandAck> acks;
        std::vector<SampleData> batch;
        v1::TrainerMessage batch_message;
        {
          std::unique_lock lock(mu_);
          cv_.wait_for(lock, 200ms, [&] { return stopping_ || impl->ended || !samples_.empty() || !acks_.empty(); });
          if (impl->ended) break;
          if (stopping_ && samples_.empty() && acks_.empty()) {
            goodbye = impl->got_hello_ack.load();
            break;
          }
          acks.assign(acks_.begin(), acks_.end());
          acks_.clear();
          while (!samples_.empty() && batch.size() < kMaxBatch) {
            batch.push_back(std::move(samples_.front()));
            samples_.pop_front();
          }
          batch_message.mutable_samples()->set_dropped_total(dropped_.load());
          in_flight_ = acks.size() + batch.size();
        }
        if (source_->layers_version() != version) {
          // New layers: a new Hello; what was taken goes back first.
          std::lock_guard lock(mu_);
          for (auto it = acks.rbegin(); it != acks.rend(); ++it) acks_.push_front(std::move(*it));
          for (auto it = batch.rbegin(); it != batch.rend(); ++it) samples_.push_front(std::move(*it));
          in_flight_ = 0;
          break;
        }
        for (const SampleData& sample : batch) *batch_message.mutable_samples()->add_samples() = to_wire(sample);
        const std::uint64_t step = source_->current_step();
        batch_message.mutable_samples()->set_current_step(step);
        const auto now = std::chrono::steady_clock::now();
        const bool heartbeat = step != 0 && step != reported_step && now - last_batch >= kHeartbeat;
        // Coverage rides on every batch, and a change of it makes a batch of its own.
        const CoverageReport coverage = source_->coverage(coverage_sent);
        const bool coverage_changed = coverage.version != coverage_sent;
        add_coverage(coverage, *batch_message.mutable_samples());
        bool wrote = true;
        for (const auto& ack : acks) {
          v1::TrainerMessage m;
          *m.mutable_ack() = to_wire(ack);
          if (!impl->stream->Write(m)) {
            wrote = false;
            break;
          }
        }
        const auto n = static_cast<std::uint64_t>(batch.size());
        if (wrote && (n > 0 || heartbeat || coverage_changed)) {
          wrote = impl->stream->Write(batch_message);
          if (wrote) {
            reported_step = step;
            last_batch = now;
            coverage_sent = coverage.version;
          }
        }
        std::lock_guard lock(mu_);
        in_flight_ = 0;
        if (!wrote) {
          // Put back what was not written; samples beyond the cap are dropped.
          for (auto it = acks.rbegin(); it != acks.rend(); ++it) acks_.push_front(std::move(*it));
          for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
            if (samples_.size() >= config_.queue_size) {
              dropped_.fetch_add(1);
            } else {
              samples_.push_front(std::move(*it));
            }
          }
          break;
        }
        sent_.fetch_add(n);
        cv_.notify_all();
      }
      if (goodbye) say_goodbye(*impl);
      connected_ = false;
    }
    // --- tear down ---------------------------------------------------------------
    impl->context.TryCancel();
    if (impl->reader.joinable()) impl->reader.join();
    if (impl->stream) {
      const grpc::Status status = impl->stream->Finish();
      bool stopping = false;
      {
        std::lock_guard lock(mu_);
        stopping = stopping_;
      }
      if (!status.ok() && !stopping) {
        log_line("agent stream ended: " + std::string(status.error_message().substr(0, 300)));
      }
    }
    {
      std::lock_guard lock(mu_);
      impl_.reset();
      if (stopping_) break;
    }
    if (ok && impl->got_hello_ack) continue;  // layers changed or the agent went away: reconnect now
    ++failures;
    if (failures == 1) {
      log_line("agent unreachable at " + config_.socket + "; training continues, retrying with backoff");
    }
    std::uniform_int_distribution<int> jitter(0, static_cast<int>(backoff.count() / 4));
    const auto wait = backoff + std::chrono::milliseconds(jitter(rng));
    backoff = std::min<std::chrono::milliseconds>(backoff * 2, max_backoff);
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, wait, [this] { return stopping_; });
  }
  std::lock_guard lock(mu_);
  exited_ = true;
  connected_ = false;
  cv_.notify_all();
}

}  // namespace gaugewatch::hooks
