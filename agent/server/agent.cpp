#include "agent/server/agent.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent/common/clock.h"
#include "agent/common/backend_names.h"
#include "agent/common/default_paths.h"
#include "agent/common/event_log.h"
#include "agent/export/exposition.h"
#include "agent/export/status_page.h"
#include "agent/export/status_page_snapshot.h"

namespace gaugewatch::agent {

namespace {

std::string read_pem(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw ConfigError(std::string(what) + ": cannot read '" + path + "'");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The default socket and database directories belong to the agent: create
// them when missing (owner and group only). A path given explicitly must
// exist already (a typo should not create directories).
void create_default_directory(const std::string& path, const std::string& default_path) {
  if (path != default_path) return;
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code error;
  if (std::filesystem::create_directories(parent, error)) {
    std::filesystem::permissions(parent, std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                             std::filesystem::perms::group_exec,
                                 error);
    events().info("created {}", parent.string());
  }
}

}  // namespace

Agent::Agent(const AgentConfig& config) : config_(config) {
  check_config(config_);
  const DefaultPaths defaults = default_paths();
  create_default_directory(config_.grpc_socket, defaults.socket);
  create_default_directory(config_.database, defaults.database);
  counters_.start_time_seconds.Set(static_cast<double>(unix_now_ns()) / 1e9);
  store_ = std::make_unique<DecisionStore>(config_.database);
  controller_ = std::make_unique<Controller>(config_, *store_, counters_);
  hook_service_ = std::make_unique<HookServiceImpl>(*controller_, config_.admin_token);
  admin_service_ = std::make_unique<AdminServiceImpl>(*controller_, config_.admin_token);
  promql_ = std::make_unique<PromqlPoller>(config_, controller_->decisions(), counters_);
  state_collector_ = std::make_unique<StateCollector>(controller_->registry());

  if (!config_.grpc_socket.empty()) {
    const auto parent = std::filesystem::path(config_.grpc_socket).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent)) {
      throw std::runtime_error("grpc_socket directory '" + parent.string() +
                               "' does not exist (create it, e.g. systemd RuntimeDirectory=gaugewatch)");
    }
    unix_listener_ = std::make_unique<UnixListener>(config_.grpc_socket,
                                                    static_cast<mode_t>(config_.socket_mode));
  }
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(HookServiceImpl::transport_limit(config_.limits.max_message_bytes)));
  // Each open trainer stream holds one of these threads (plus its writer).
  grpc::ResourceQuota quota("gaugewatch-agent");
  quota.SetMaxThreads(static_cast<int>(config_.limits.max_streams) + 64);
  builder.SetResourceQuota(quota);
  builder.RegisterService(hook_service_.get());
  builder.RegisterService(admin_service_.get());
  if (!config_.tcp_listen.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back(
        {read_pem(config_.tls_key, "tls_key"), read_pem(config_.tls_cert, "tls_cert")});
    builder.AddListeningPort(config_.tcp_listen, grpc::SslServerCredentials(ssl), &tcp_port_);
  }
  server_ = builder.BuildAndStart();
  if (!server_) {
    throw std::runtime_error("cannot start the gRPC server (tcp '" + config_.tcp_listen +
                             "'): address in use?");
  }
  if (!config_.tcp_listen.empty() && tcp_port_ == 0) {
    server_->Shutdown();
    throw std::runtime_error("cannot listen on tcp_listen '" + config_.tcp_listen + "'");
  }
  if (unix_listener_) unix_listener_->serve(*server_);
  try {
    http_ = std::make_unique<HttpServer>(config_.http_listen);
  } catch (...) {
    if (unix_listener_) unix_listener_->stop();
    server_->Shutdown();
    throw;
  }
  http_->register_handler("/metrics", [this](const HttpServer::Request&) { return metrics(); });
  http_->register_handler("/healthz", [this](const HttpServer::Request&) {
    return HttpServer::Response{
        200, "text/plain; charset=utf-8",
        "ok\n" + std::to_string(static_cast<long long>(counters_.trainers_connected.Value())) +
            " trainers connected\n"};
  });
  // The built-in status page (agent/export/status_page.h).
  http_->register_handler("/", [this](const HttpServer::Request& r) { return status_page(r); });
  http_->register_handler("/ui", [this](const HttpServer::Request& r) { return status_page(r); });
  housekeeper_ = std::thread([this] { housekeeping(); });
}

Agent::~Agent() { shutdown(); }

HttpServer::Response Agent::metrics() {
  const std::int64_t begin = steady_now_ns();
  counters_.scrapes_total.Increment();
  HttpServer::Response response{200, std::string(kExpositionContentType),
                                render_metrics({&counters_.registry()}, *state_collector_)};
  counters_.last_scrape_duration_seconds.Set(static_cast<double>(steady_now_ns() - begin) / 1e9);
  return response;
}

HttpServer::Response Agent::status_page(const HttpServer::Request& request) {
  constexpr std::uint32_t kRecentDecisions = 20;
  const StatusSources sources{
      controller_->registry(), store_->decisions("", kRecentDecisions),
      kAgentVersion, static_cast<std::uint64_t>(counters_.trainers_connected.Value()), unix_now_ns()};
  return {200, "text/html; charset=utf-8",
          render_status_page(build_status_view(sources, runs_from_query(request.query)))};
}

void Agent::housekeeping() {
  const auto tick = std::chrono::milliseconds(static_cast<std::int64_t>(
      std::clamp(std::min(config_.rank_expiry_seconds * 250.0,
                          config_.retention_interval_seconds * 1000.0),
                 50.0, 1000.0)));
  auto next_promql = std::chrono::steady_clock::now();
  auto next_retention = std::chrono::steady_clock::now();  // a first pass at start-up
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    controller_->expire_ranks();
    hook_service_->cancel_late_hellos(steady_now_ns());
    if (std::chrono::steady_clock::now() >= next_retention) {
      controller_->enforce_retention();
      next_retention = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(static_cast<std::int64_t>(
                           config_.retention_interval_seconds * 1000));
    }
    if (!config_.promql_rules.empty() && std::chrono::steady_clock::now() >= next_promql) {
      promql_->poll_once();
      next_promql = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(
                        static_cast<std::int64_t>(config_.promql_interval_seconds * 1000));
    }
    lock.lock();
    cv_.wait_for(lock, tick, [this] { return stopping_; });
  }
}

void Agent::shutdown(int grace_ms) {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  if (housekeeper_.joinable()) housekeeper_.join();
  if (unix_listener_) unix_listener_->stop();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  server_->Wait();
  http_.reset();
}

}  // namespace gaugewatch::agent
