#pragma once
// The whole daemon, wired: SQLite store, controller, gRPC server (unix socket
// and optional TCP + TLS), HTTP exporter, and a housekeeping thread (rank
// expiry, PromQL rules). main() only parses flags and waits for a signal.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "agent/config/agent_config.h"
#include "agent/export/http_server.h"
#include "agent/export/state_collector.h"
#include "agent/rules/promql_poller.h"
#include "agent/server/admin_service.h"
#include "agent/server/controller.h"
#include "agent/server/hook_service.h"
#include "agent/server/unix_listener.h"
#include "agent/store/decision_store.h"

namespace grpc {
class Server;
}

namespace gaugewatch::agent {

class Agent {
 public:
  // Starts everything; throws (ConfigError, StoreError, std::runtime_error)
  // with a message saying what could not start.
  explicit Agent(const AgentConfig& config);
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Stops accepting, ends open streams within `grace_ms`, stops HTTP.
  void shutdown(int grace_ms = 2000);

  std::uint16_t http_port() const { return http_->port(); }
  // The one HTTP port: other parts add their pages here (register_handler).
  HttpServer& http() { return *http_; }
  int tcp_port() const { return tcp_port_; }
  Controller& controller() { return *controller_; }
  const AgentConfig& config() const { return config_; }

 private:
  void housekeeping();
  HttpServer::Response metrics();
  HttpServer::Response status_page(const HttpServer::Request& request);

  AgentConfig config_;
  AgentCounters counters_;
  std::unique_ptr<DecisionStore> store_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<HookServiceImpl> hook_service_;
  std::unique_ptr<AdminServiceImpl> admin_service_;
  std::unique_ptr<UnixListener> unix_listener_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<StateCollector> state_collector_;
  std::unique_ptr<HttpServer> http_;
  std::unique_ptr<PromqlPoller> promql_;
  int tcp_port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::thread housekeeper_;
};

}  // namespace gaugewatch::agent
