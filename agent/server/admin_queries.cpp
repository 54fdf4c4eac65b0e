#include "agent/server/admin_queries.h"

#include <string>

#include "agent/common/backend_names.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

void AdminQueries::status(v1::GetStatusResponse& out) const {
  out.set_agent_version(std::string(kAgentVersion));
  out.set_start_unix_time_ns(start_unix_ns_);
  std::string last_run;
  std::uint32_t runs = 0;
  std::uint32_t connected = 0;
  std::uint32_t expired = 0;
  for (const auto& entry : registry_.ranks()) {
    std::lock_guard lock(entry->mu);
    if (entry->run_id != last_run) {
      ++runs;
      last_run = entry->run_id;
    }
    connected += entry->connected ? 1 : 0;
    expired += entry->expired ? 1 : 0;
  }
  out.set_runs(runs);
  out.set_ranks_connected(connected);
  out.set_ranks_expired(expired);
  out.set_samples_received_total(static_cast<std::uint64_t>(counters_.samples_received_total.Value()));
  out.set_samples_rejected_total(static_cast<std::uint64_t>(counters_.samples_rejected_total.Value()));
  std::uint64_t shed = 0;
  for (const auto* reason : counters_.samples_shed_total) shed += static_cast<std::uint64_t>(reason->Value());
  out.set_samples_shed_total(shed);
  out.set_decisions_total(book_.size());
  out.set_rules(static_cast<std::uint32_t>(rule_count_));
  out.set_grpc_listen(config_.grpc_socket.empty() ? config_.tcp_listen
                                                  : "unix:" + config_.grpc_socket +
                                                        (config_.tcp_listen.empty()
                                                             ? ""
                                                             : " tcp:" + config_.tcp_listen));
  out.set_http_listen(config_.http_listen);
  out.set_database(config_.database);
}

void AdminQueries::list_runs(const v1::ListRunsRequest& request, v1::ListRunsResponse& out) const {
  registry_.list(request, out);
}

void AdminQueries::list_decisions(const v1::ListDecisionsRequest& request,
                                  v1::ListDecisionsResponse& out) const {
  for (auto& decision : store_.decisions(request.run_id(), request.limit())) {
    *out.add_decisions() = std::move(decision);
  }
  if (request.include_audit()) {
    for (auto& record : store_.audit(request.run_id(), request.limit())) {
      *out.add_audit() = std::move(record);
    }
  }
}

}  // namespace gaugewatch::agent
