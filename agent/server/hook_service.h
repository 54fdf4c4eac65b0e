#pragma once
// gRPC HookService (/gaugewatch.v1.HookService/Connect): one bidirectional
// stream per trainer, a thin wrapper over Controller. The method is served
// on raw bytes so that the agent itself parses each TrainerMessage: bytes
// that are no message end the stream with INVALID_ARGUMENT, a message over
// limits.max_message_bytes with RESOURCE_EXHAUSTED, both counted by reason.
// Streams are capped (limits.max_streams) and must send their Hello within
// limits.hello_timeout_seconds. A writer thread per stream, started at the
// Hello, drains the session's outbox. Streams over TCP must carry the same
// bearer token as admin calls; over the unix socket none is needed.

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/service_type.h>
#include <grpcpp/impl/codegen/sync_stream.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "agent/server/controller.h"

namespace gaugewatch::agent {

class HookServiceImpl final : public grpc::Service {
 public:
  // Sizes above this never reach the agent: gRPC refuses them itself.
  static std::uint32_t transport_limit(std::uint32_t max_message_bytes);

  HookServiceImpl(Controller& controller, std::string token);

  grpc::Status Connect(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>* stream);

  // Cancels every stream that has not sent its Hello within the deadline
  // (called by the agent's housekeeping thread). Returns how many.
  std::size_t cancel_late_hellos(std::int64_t steady_now_ns);

  int open_streams() const { return open_streams_.load(); }

 private:
  struct Waiting {
    grpc::ServerContext* context;
    std::int64_t opened_ns;
    bool cancelled = false;
  };

  Controller& controller_;
  const std::string token_;
  std::atomic<int> open_streams_{0};
  std::mutex waiting_mu_;
  std::map<std::uint64_t, Waiting> waiting_;  // session id -> stream without a Hello yet
};

}  // namespace gaugewatch::agent
