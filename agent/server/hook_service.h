#pragma once
// gRPC HookService: one bidirectional stream per trainer, a thin wrapper over
// Controller. A writer thread per stream drains the session's outbox. Streams
// over TCP must carry the same bearer token as admin calls; over the unix
// socket none is needed.

#include <string>

#include "agent/server/controller.h"
#include "gaugewatch/v1/hook_service.grpc.pb.h"

namespace gaugewatch::agent {

class HookServiceImpl final : public gaugewatch::v1::HookService::Service {
 public:
  HookServiceImpl(Controller& controller, std::string token)
      : controller_(controller), token_(std::move(token)) {}

  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<gaugewatch::v1::AgentMessage, gaugewatch::v1::TrainerMessage>*
          stream) override;

 private:
  Controller& controller_;
  const std::string token_;
};

}  // namespace gaugewatch::agent
