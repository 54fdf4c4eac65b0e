#include "agent/server/agent.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent/common/clock.h"
#include "agent/export/exposition.h"

namespace gaugewatch::agent {

namespace {

std::string read_pem(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw ConfigError(std::string(what) + ": cannot read '" + path + "'");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Removes a stale socket left by a previous run; refuses to remove anything else.
void remove_stale_socket(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return;
  if (!S_ISSOCK(st.st_mode)) {
    throw std::runtime_error("grpc_socket '" + path + "' exists and is not a socket");
  }
  ::unlink(path.c_str());
}

}  // namespace

Agent::Agent(const AgentConfig& config) : config_(config) {
  check_config(config_);
  start_seconds_ = static_cast<double>(unix_now_ns()) / 1e9;
  store_ = std::make_unique<DecisionStore>(config_.database);
  controller_ = std::make_unique<Controller>(config_, *store_, counters_);
  hook_service_ = std::make_unique<HookServiceImpl>(*controller_, config_.admin_token);
  admin_service_ = std::make_unique<AdminServiceImpl>(*controller_, config_.admin_token);
  promql_ = std::make_unique<PromqlPoller>(config_, *controller_);

  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(static_cast<int>(config_.limits.max_message_bytes));
  builder.RegisterService(hook_service_.get());
  builder.RegisterService(admin_service_.get());
  if (!config_.grpc_socket.empty()) {
    const auto parent = std::filesystem::path(config_.grpc_socket).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent)) {
      throw std::runtime_error("grpc_socket directory '" + parent.string() +
                               "' does not exist (create it, e.g. systemd RuntimeDirectory=gaugewatch)");
    }
    if (config_.grpc_socket.size() >= sizeof(sockaddr_un{}.sun_path)) {
      throw std::runtime_error("grpc_socket path longer than " +
                               std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes");
    }
    remove_stale_socket(config_.grpc_socket);
    builder.AddListeningPort("unix:" + config_.grpc_socket, grpc::InsecureServerCredentials());
  }
  if (!config_.tcp_listen.empty()) {
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back(
        {read_pem(config_.tls_key, "tls_key"), read_pem(config_.tls_cert, "tls_cert")});
    builder.AddListeningPort(config_.tcp_listen, grpc::SslServerCredentials(ssl), &tcp_port_);
  }
  // The socket is created with the final mode: no window where it is wider.
  const mode_t old_umask = ::umask(static_cast<mode_t>(~config_.socket_mode & 0777));
  server_ = builder.BuildAndStart();
  ::umask(old_umask);
  if (!server_) {
    throw std::runtime_error("cannot start the gRPC server (socket '" + config_.grpc_socket +
                             "', tcp '" + config_.tcp_listen + "'): address in use or directory missing");
  }
  if (!config_.tcp_listen.empty() && tcp_port_ == 0) {
    server_->Shutdown();
    throw std::runtime_error("cannot listen on tcp_listen '" + config_.tcp_listen + "'");
  }
  if (!config_.grpc_socket.empty() &&
      ::chmod(config_.grpc_socket.c_str(), static_cast<mode_t>(config_.socket_mode)) != 0) {
    server_->Shutdown();
    throw std::runtime_error("chmod " + config_.grpc_socket + ": " + std::strerror(errno));
  }
  try {
    http_ = std::make_unique<HttpServer>(
        config_.http_listen, [this](const std::string& accept) { return metrics(accept); },
        [this] {
          return HttpServer::Response{200, "text/plain; charset=utf-8",
                                      "ok\n" + std::to_string(counters_.trainers_connected.load()) +
                                          " trainers connected\n"};
        });
  } catch (...) {
    server_->Shutdown();
    throw;
  }
  housekeeper_ = std::thread([this] { housekeeping(); });
}

Agent::~Agent() { shutdown(); }

HttpServer::Response Agent::metrics(const std::string& accept) {
  const std::int64_t begin = steady_now_ns();
  const auto format = negotiate(accept);
  counters_.scrapes_total.fetch_add(1);
  HttpServer::Response response{200, std::string(content_type(format)),
                                render_metrics({controller_->registry(), counters_, start_seconds_},
                                               format)};
  counters_.last_scrape_duration_ns.store(static_cast<std::uint64_t>(steady_now_ns() - begin));
  return response;
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
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  server_->Wait();
  http_.reset();
  if (!config_.grpc_socket.empty()) ::unlink(config_.grpc_socket.c_str());
}

}  // namespace gaugewatch::agent
