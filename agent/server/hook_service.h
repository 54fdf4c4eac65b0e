#pragma once
// gRPC HookService: one bidirectional stream per trainer, a thin wrapper over
// Controller. A writer thread per stream drains the session's outbox.

#include "agent/server/controller.h"
#include "gaugewatch/v1/hook_service.grpc.pb.h"

namespace gaugewatch::agent {

class HookServiceImpl final : public gaugewatch::v1::HookService::Service {
 public:
  explicit HookServiceImpl(Controller& controller) : controller_(controller) {}

  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<gaugewatch::v1::AgentMessage, gaugewatch::v1::TrainerMessage>*
          stream) override;

 private:
  Controller& controller_;
};

}  // namespace gaugewatch::agent
