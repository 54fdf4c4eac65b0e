#pragma once
// Shared calls of the agent integration tests on a running agent: its
// Prometheus text over HTTP, lines and values in that text, and ListRuns.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <string>

#include "agent/export/http_server.h"
#include "agent/server/agent.h"
#include "gaugewatch/v1/admin_service.grpc.pb.h"

namespace gaugewatch::agent {

// GET /metrics of `agent`, with an Accept header when `accept` is not empty.
inline std::string scrape(const Agent& agent, const std::string& accept = "") {
  return http_get("127.0.0.1", agent.http_port(), "/metrics", accept).body;
}

// Whether `text` holds `line` as a whole line.
inline bool has_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.rfind(line + "\n", 0) == 0;
}

// The value of the sample `series` (name and labels) in `text`; -1 where none.
inline double metric_value(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

// ListRuns of `run` with its layers; a failed call fails the test.
inline gaugewatch::v1::ListRunsResponse list_runs(gaugewatch::v1::AdminService::Stub& admin, const std::string& run) {
  grpc::ClientContext context;
  gaugewatch::v1::ListRunsRequest request;
  request.set_run_id(run);
  request.set_include_layers(true);
  gaugewatch::v1::ListRunsResponse response;
  EXPECT_TRUE(admin.ListRuns(&context, request, &response).ok());
  return response;
}

}  // namespace gaugewatch::agent
