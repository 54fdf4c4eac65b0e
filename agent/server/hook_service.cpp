#include "agent/server/hook_service.h"

#include <thread>

#include "agent/server/bearer_auth.h"

namespace gaugewatch::agent {

grpc::Status HookServiceImpl::Connect(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<gaugewatch::v1::AgentMessage, gaugewatch::v1::TrainerMessage>*
        stream) {
  if (auto status = authorize_peer(*context, token_, "hook streams"); !status.ok()) {
    controller_.counters().hook_streams_refused_total.fetch_add(1);
    return status;
  }
  auto session = controller_.open_session();
  std::thread writer([&stream, session] {
    gaugewatch::v1::AgentMessage message;
    while (session->pop(message)) {
      if (!stream->Write(message)) break;
    }
  });
  grpc::Status status = grpc::Status::OK;
  gaugewatch::v1::TrainerMessage message;
  while (stream->Read(&message)) {
    const Verdict verdict = controller_.handle(session, message);
    if (!verdict.ok()) {
      const auto code = verdict.reason == RejectReason::kProtocolVersion
                            ? grpc::StatusCode::FAILED_PRECONDITION
                            : grpc::StatusCode::INVALID_ARGUMENT;
      status = grpc::Status(code, std::string(reject_reason_name(verdict.reason)) + ": " +
                                      verdict.detail);
      break;
    }
  }
  controller_.close_session(*session);
  writer.join();
  return status;
}

}  // namespace gaugewatch::agent
