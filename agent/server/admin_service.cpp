#include "agent/server/admin_service.h"

#include "agent/common/backend_names.h"
#include "agent/server/bearer_auth.h"
#include "agent/server/peer_identity.h"

#include <algorithm>

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

grpc::Status AdminServiceImpl::authorize(const grpc::ServerContext& context) const {
  return authorize_peer(context, token_, "admin calls");
}

grpc::Status AdminServiceImpl::GetStatus(grpc::ServerContext* context,
                                         const v1::GetStatusRequest* /*request*/,
                                         v1::GetStatusResponse* response) {
  if (auto s = authorize(*context); !s.ok()) return s;
  controller_.status(*response);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::ListRuns(grpc::ServerContext* context,
                                        const v1::ListRunsRequest* request,
                                        v1::ListRunsResponse* response) {
  if (auto s = authorize(*context); !s.ok()) return s;
  controller_.list_runs(*request, *response);
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::SetBackend(grpc::ServerContext* context,
                                          const v1::SetBackendRequest* request,
                                          v1::SetBackendResponse* response) {
  if (auto s = authorize(*context); !s.ok()) return s;
  if (!parse_backend(backend_name(request->backend()))) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "backend must be stock, gproj, pivot or fp32"};
  }
  if (auto s = check_target(request->target()); !s.ok()) return s;
  if (auto s = check_target_known(request->target()); !s.ok()) return s;
  const auto& target = request->target();
  if (request->reason().size() > 1024) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "reason longer than 1024 bytes"};
  }
  try {
    auto result = controller_.decide(v1::DECISION_SOURCE_ADMIN, "admin " + peer_identity(*context), target,
                                     request->backend(),
                                     request->reason().empty() ? "set by operator" : request->reason());
    response->set_decision_id(result.decision_id);
    response->set_commands_sent(result.commands_sent);
  } catch (const StoreError& e) {
    controller_.counters().store_errors_total.Increment();
    return {grpc::StatusCode::UNAVAILABLE, std::string("decision not stored: ") + e.what()};
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::check_target(const v1::Target& target) const {
  const auto& limits = controller_.config().limits;
  if (target.all_runs() == !target.run_id().empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "give exactly one of run_id and all_runs"};
  }
  if (!target.all_runs() && !is_label_safe(target.run_id(), limits.max_run_id_bytes)) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "run_id must match [A-Za-z0-9_.:-]{1,128}"};
  }
  if (static_cast<std::uint32_t>(target.layers_size()) > limits.max_layers) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "too many layers"};
  }
  for (auto layer : target.layers()) {
    if (layer >= limits.max_layers) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "layer " + std::to_string(layer) + " exceeds max_layers"};
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::check_target_known(const v1::Target& target) const {
  if (target.all_runs()) return grpc::Status::OK;  // covers runs that connect later too
  bool run_known = false;
  bool rank_known = false;
  std::uint32_t layer_count = 0;  // most layers of any rank the target covers
  for (const auto& entry : controller_.registry().ranks()) {
    std::lock_guard lock(entry->mu);
    if (entry->run_id != target.run_id()) continue;
    run_known = true;
    if (target.has_rank() && entry->rank != target.rank()) continue;
    rank_known = true;
    layer_count = std::max(layer_count, entry->layer_count);
  }
  if (!run_known) {
    return {grpc::StatusCode::NOT_FOUND,
            "run '" + target.run_id() + "' is not known to this agent (no trainer of it is "
            "connected or remembered; `gaugewatchctl layers` lists the runs)"};
  }
  if (!rank_known) {
    return {grpc::StatusCode::NOT_FOUND, "run '" + target.run_id() + "' has no rank " +
                                             std::to_string(target.rank()) +
                                             " (`gaugewatchctl layers --run " + target.run_id() +
                                             "` lists its ranks)"};
  }
  for (const auto layer : target.layers()) {
    if (layer >= layer_count) {
      return {grpc::StatusCode::OUT_OF_RANGE,
              "layer " + std::to_string(layer) + " is out of range: the target's ranks have " +
                  std::to_string(layer_count) + " layers" +
                  (layer_count > 0 ? " (0.." + std::to_string(layer_count - 1) + ")" : "")};
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::SetSampling(grpc::ServerContext* context,
                                           const v1::SetSamplingRequest* request,
                                           v1::CommandResponse* response) {
  if (auto s = authorize(*context); !s.ok()) return s;
  if (auto s = check_target(request->target()); !s.ok()) return s;
  const auto& p = request->sampling();
  for (double fraction : {p.layer_fraction(), p.overhead_budget()}) {
    if (!(fraction >= 0.0 && fraction <= 1.0)) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "layer_fraction and overhead_budget must be in [0, 1]"};
    }
  }
  if (auto s = check_target_known(request->target()); !s.ok()) return s;
  if (p.every_n_steps() == 0 && p.layer_fraction() == 0 && p.max_heads() == 0 && p.max_rows() == 0 &&
      p.overhead_budget() == 0) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "sampling policy sets nothing"};
  }
  v1::Command command;
  *command.mutable_set_sampling() = p;
  command.set_reason("admin");
  return send_admin_command(*context, request->target(), command, response);
}

// Audits then sends an admin command; a store failure means neither happened.
grpc::Status AdminServiceImpl::send_admin_command(const grpc::ServerContext& context, const v1::Target& target,
                                                  const v1::Command& command, v1::CommandResponse* response) {
  try {
    response->set_commands_sent(controller_.send_command(target, command, peer_identity(context)));
  } catch (const StoreError& e) {
    controller_.counters().store_errors_total.Increment();
    return {grpc::StatusCode::UNAVAILABLE, std::string("not audited, not sent: ") + e.what()};
  }
  return grpc::Status::OK;
}

grpc::Status AdminServiceImpl::CaptureOperands(grpc::ServerContext* context,
                                               const v1::CaptureOperandsRequest* request,
                                               v1::CommandResponse* response) {
  if (auto s = authorize(*context); !s.ok()) return s;
  if (auto s = check_target(request->target()); !s.ok()) return s;
  if (request->target().layers_size() != 1) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "capture needs exactly one layer"};
  }
  if (auto s = check_target_known(request->target()); !s.ok()) return s;
  if (request->count() == 0 || request->count() > 1000) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "count must be in [1, 1000]"};
  }
  v1::Command command;
  command.mutable_capture()->set_layer(request->target().layers(0));
  command.mutable_capture()->set_count(request->count());
  command.set_reason("admin");
  return send_admin_command(*context, request->target(), command, response);
}

grpc::Status AdminServiceImpl::ListDecisions(grpc::ServerContext* context,
                                             const v1::ListDecisionsRequest* request,
                                             v1::ListDecisionsResponse* response) {
  if (auto s = authorize(*context); !s.ok()) return s;
  if (request->limit() > 10000) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "limit must be <= 10000"};
  }
  try {
    controller_.list_decisions(*request, *response);
  } catch (const StoreError& e) {
    return {grpc::StatusCode::UNAVAILABLE, e.what()};
  }
  return grpc::Status::OK;
}

}  // namespace gaugewatch::agent
