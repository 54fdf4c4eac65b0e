#include "agent/server/hook_service.h"

#include <grpcpp/impl/codegen/method_handler.h>
#include <google/protobuf/arena.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "agent/common/clock.h"
#include "agent/server/bearer_auth.h"
#include "agent/server/peer_identity.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

namespace {

constexpr char kConnectMethod[] = "/gaugewatch.v1.HookService/Connect";
// Parse arena per stream: holds a 64-sample batch without growing.
constexpr std::size_t kArenaBlockBytes = 128 * 1024;

bool parse(const grpc::ByteBuffer& buffer, v1::TrainerMessage& message) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  if (slices.size() == 1) return message.ParseFromArray(slices[0].begin(), static_cast<int>(slices[0].size()));
  std::string bytes;
  bytes.reserve(buffer.Length());
  for (const auto& slice : slices) bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return message.ParseFromString(bytes);
}

}  // namespace

std::uint32_t HookServiceImpl::transport_limit(std::uint32_t max_message_bytes) {
  // Room to see (and count) oversized messages up to twice the limit.
  return std::max<std::uint32_t>(max_message_bytes, 1u << 20) * 2;
}

HookServiceImpl::HookServiceImpl(Controller& controller, std::string token)
    : controller_(controller), token_(std::move(token)) {
  AddMethod(new grpc::internal::RpcServiceMethod(
      kConnectMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
      new grpc::internal::BidiStreamingHandler<HookServiceImpl, grpc::ByteBuffer, grpc::ByteBuffer>(
          [](HookServiceImpl* service, grpc::ServerContext* context,
             grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
            return service->Connect(context, stream);
          },
          this)));
}

std::size_t HookServiceImpl::cancel_late_hellos(std::int64_t steady_now) {
  const auto deadline_ns =
      static_cast<std::int64_t>(controller_.config().limits.hello_timeout_seconds) * 1'000'000'000;
  std::size_t cancelled = 0;
  std::lock_guard lock(waiting_mu_);
  for (auto& [id, waiting] : waiting_) {
    if (!waiting.cancelled && steady_now - waiting.opened_ns > deadline_ns) {
      waiting.cancelled = true;
      waiting.context->TryCancel();
      ++cancelled;
    }
  }
  return cancelled;
}

grpc::Status HookServiceImpl::Connect(
    grpc::ServerContext* context, grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream) {
  auto& counters = controller_.counters();
  if (auto status = authorize_peer(*context, token_, "hook streams"); !status.ok()) {
    counters.hook_streams_refused_total.Increment();
    return status;
  }
  const auto& limits = controller_.config().limits;
  if (open_streams_.fetch_add(1) >= static_cast<int>(limits.max_streams)) {
    open_streams_.fetch_sub(1);
    counters.refused(StreamRefusal::kStreamLimit).Increment();
    events().warn("trainer stream refused: {} streams open (limits.max_streams); peer {}",
                  limits.max_streams, peer_identity(*context));
    return {grpc::StatusCode::RESOURCE_EXHAUSTED,
            "the agent has limits.max_streams (" + std::to_string(limits.max_streams) +
                ") trainer streams open; try again later"};
  }
  struct OpenCount {
    std::atomic<int>& open;
    ~OpenCount() { open.fetch_sub(1); }
  } open_count{open_streams_};

  auto session = controller_.open_session();
  session->peer = peer_identity(*context);
  {
    std::lock_guard lock(waiting_mu_);
    waiting_[session->id()] = {context, steady_now_ns()};
  }
  const auto stop_waiting = [&] {
    std::lock_guard lock(waiting_mu_);
    const auto it = waiting_.find(session->id());
    const bool timed_out = it != waiting_.end() && it->second.cancelled;
    if (it != waiting_.end()) waiting_.erase(it);
    return timed_out;
  };

  std::thread writer;
  grpc::Status status = grpc::Status::OK;
  grpc::ByteBuffer buffer;
  // Each message is parsed into an arena that is reset after it is handled:
  // a batch's samples and their sub-messages cost no malloc or free each.
  std::vector<char> arena_block(kArenaBlockBytes);
  google::protobuf::ArenaOptions arena_options;
  arena_options.initial_block = arena_block.data();
  arena_options.initial_block_size = arena_block.size();
  arena_options.max_block_size = kArenaBlockBytes;
  google::protobuf::Arena arena(arena_options);
  bool waiting_for_hello = true;
  while (stream->Read(&buffer)) {
    arena.Reset();
    auto& message = *google::protobuf::Arena::CreateMessage<v1::TrainerMessage>(&arena);
    Verdict verdict;
    if (buffer.Length() > limits.max_message_bytes) {
      verdict = controller_.reject_transport(
          RejectReason::kTooLarge, "message of " + std::to_string(buffer.Length()) +
                                       " bytes; limits.max_message_bytes is " +
                                       std::to_string(limits.max_message_bytes));
    } else if (!parse(buffer, message)) {
      verdict = controller_.reject_transport(
          RejectReason::kUnparseable,
          "a message of " + std::to_string(buffer.Length()) + " bytes that is no TrainerMessage");
    } else {
      verdict = controller_.handle(session, message);
    }
    if (!verdict.ok()) {
      const auto code = verdict.reason == RejectReason::kProtocolVersion ? grpc::StatusCode::FAILED_PRECONDITION
                        : verdict.reason == RejectReason::kTooLarge      ? grpc::StatusCode::RESOURCE_EXHAUSTED
                                                                         : grpc::StatusCode::INVALID_ARGUMENT;
      status = grpc::Status(code, std::string(reject_reason_name(verdict.reason)) + ": " +
                                      verdict.detail);
      break;
    }
    if (waiting_for_hello && session->hello_done) {
      waiting_for_hello = false;
      if (stop_waiting()) break;  // cancelled just as the Hello arrived
      writer = std::thread([stream, session] {
        v1::AgentMessage out;
        while (session->pop(out)) {
          grpc::ByteBuffer bytes;
          bool own = false;
          if (!grpc::SerializationTraits<v1::AgentMessage>::Serialize(out, &bytes, &own).ok() ||
              !stream->Write(bytes)) {
            break;
          }
        }
      });
    }
  }
  if (waiting_for_hello && stop_waiting()) {
    counters.refused(StreamRefusal::kHelloDeadline).Increment();
    events().warn("trainer stream ended: no Hello within limits.hello_timeout_seconds={} s; peer {}",
                  limits.hello_timeout_seconds, session->peer);
    status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "no Hello within " + std::to_string(limits.hello_timeout_seconds) + " s");
  }
  controller_.close_session(*session);
  if (writer.joinable()) writer.join();
  return status;
}

}  // namespace gaugewatch::agent
