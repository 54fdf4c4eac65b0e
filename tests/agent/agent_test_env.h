#pragma once
// Shared pieces of the agent integration tests: a hermetic configuration
// (temp dir socket and database, HTTP on a free port) and channel helpers.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "agent/config/agent_config.h"
#include "tests/agent/temp_dir.h"

namespace gaugewatch::agent {

inline AgentConfig hermetic_config(const TempDir& dir) {
  AgentConfig config;
  config.grpc_socket = dir.path() + "/agent.sock";
  config.http_listen = "127.0.0.1:0";
  config.database = dir.path() + "/agent.db";
  return config;
}

inline std::shared_ptr<grpc::Channel> unix_channel(const AgentConfig& config) {
  return grpc::CreateChannel("unix:" + config.grpc_socket, grpc::InsecureChannelCredentials());
}

// Polls `done` every 20 ms until it holds or `timeout` passes.
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

}  // namespace gaugewatch::agent
