#pragma once
// Builds the status page's StatusView from the agent's state: the run
// registry (runs > ranks > layers with each layer's recent live dQ
// discrepancies, coverage, rank identity) and the newest decisions from the
// store.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "agent/export/status_page.h"
#include "agent/state/run_registry.h"
#include "gaugewatch/v1/admin_service.pb.h"

namespace gaugewatch::agent {

struct StatusSources {
  const RunRegistry& registry;
  std::vector<gaugewatch::v1::Decision> decisions;  // newest first
  std::string_view agent_version;
  std::uint64_t trainers_connected = 0;
  std::int64_t now_unix_ns = 0;
};

// `runs`: only these run ids (empty: every run).
StatusView build_status_view(const StatusSources& sources, const std::vector<std::string>& runs);

// The run ids of a query string "run=a,b" (also "run=a&run=b"), URL-decoded.
std::vector<std::string> runs_from_query(std::string_view query);

}  // namespace gaugewatch::agent
