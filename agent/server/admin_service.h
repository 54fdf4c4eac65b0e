#pragma once
// gRPC AdminService. Calls over the unix socket are trusted (file
// permissions guard it); calls over TCP must carry
// "authorization: Bearer <token>".

#include <string>

#include "agent/server/controller.h"
#include "gaugewatch/v1/admin_service.grpc.pb.h"

namespace gaugewatch::agent {

class AdminServiceImpl final : public gaugewatch::v1::AdminService::Service {
 public:
  AdminServiceImpl(Controller& controller, std::string token)
      : controller_(controller), token_(std::move(token)) {}

  grpc::Status GetStatus(grpc::ServerContext* context, const gaugewatch::v1::GetStatusRequest* request,
                         gaugewatch::v1::GetStatusResponse* response) override;
  grpc::Status ListRuns(grpc::ServerContext* context, const gaugewatch::v1::ListRunsRequest* request,
                        gaugewatch::v1::ListRunsResponse* response) override;
  grpc::Status SetBackend(grpc::ServerContext* context,
                          const gaugewatch::v1::SetBackendRequest* request,
                          gaugewatch::v1::SetBackendResponse* response) override;
  grpc::Status ListDecisions(grpc::ServerContext* context,
                             const gaugewatch::v1::ListDecisionsRequest* request,
                             gaugewatch::v1::ListDecisionsResponse* response) override;
  grpc::Status SetSampling(grpc::ServerContext* context,
                           const gaugewatch::v1::SetSamplingRequest* request,
                           gaugewatch::v1::CommandResponse* response) override;
  grpc::Status CaptureOperands(grpc::ServerContext* context,
                               const gaugewatch::v1::CaptureOperandsRequest* request,
                               gaugewatch::v1::CommandResponse* response) override;

 private:
  grpc::Status authorize(const grpc::ServerContext& context) const;
  grpc::Status check_target(const gaugewatch::v1::Target& target) const;
  // A named run, rank and layers must be known to the agent: a typo is an
  // error (NOT_FOUND, OUT_OF_RANGE), never a decision nobody will receive.
  grpc::Status check_target_known(const gaugewatch::v1::Target& target) const;
  grpc::Status send_admin_command(const grpc::ServerContext& context, const gaugewatch::v1::Target& target,
                                  const gaugewatch::v1::Command& command,
                                  gaugewatch::v1::CommandResponse* response);
  Controller& controller_;
  const std::string token_;
};

}  // namespace gaugewatch::agent
