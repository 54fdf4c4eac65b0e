#pragma once
// The agent's built-in status page (GET / and /ui on the /metrics port): runs >
// ranks > layers with the backend each layer runs and the one decisions ask
// for, sparklines of each layer's recent live dQ discrepancy, recent switch
// decisions and coverage warnings (unmonitored attention calls, unmonitored
// layers, silent ranks). One self-contained HTML document: inline CSS and
// SVG, no script, no external asset (it must work on an air-gapped node); it
// reloads itself every few seconds.
//
// The page renders a StatusView, a plain snapshot the agent builds from its
// state (status_page_snapshot.h); nothing here reads the agent's state.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gaugewatch::agent {

struct StatusLayer {
  std::uint32_t index = 0;
  std::string name;     // module name
  std::string backend;  // the backend the layer runs ("stock", "gproj", ...)
  std::string desired;  // the backend decisions ask for ("" = none)
  bool monitored = true;
  std::string unmonitored_reason;
  std::optional<double> live_dq;       // latest live dQ discrepancy
  std::optional<double> gproj_dq;      // latest GProj dQ discrepancy
  std::optional<double> offset_ratio;  // latest median key offset/spread ratio
  std::uint64_t samples = 0;
  std::vector<double> recent_live_dq;  // oldest first
};

struct UnmonitoredCalls {
  std::string reason;
  std::uint64_t calls = 0;
};

struct StatusRank {
  enum class State { kConnected, kDisconnected, kFinished, kSilent };
  std::uint32_t rank = 0;
  std::uint32_t local_rank = 0;
  std::string host;
  std::string gpu_uuid;
  std::string pci_bus_id;
  State state = State::kConnected;
  std::uint64_t monitored_calls = 0;
  std::vector<UnmonitoredCalls> unmonitored_calls;
  std::vector<StatusLayer> layers;
};

struct StatusRun {
  std::string run;
  std::vector<StatusRank> ranks;
};

struct StatusDecision {
  std::int64_t time_unix_ns = 0;
  std::string run;                  // "" = every run
  std::optional<std::uint32_t> rank;  // empty = every rank
  std::vector<std::uint32_t> layers;  // empty = every layer
  std::string backend;
  std::string source;  // rule, promql_rule, admin
  std::string reason;
};

struct StatusView {
  std::string agent_version;
  std::int64_t now_unix_ns = 0;
  std::uint64_t trainers_connected = 0;
  double switch_threshold = 0.05;  // drawn on the sparklines
  std::vector<StatusRun> runs;
  std::vector<StatusDecision> decisions;  // newest first
};

// Seconds between the page's reloads.
inline constexpr int kStatusPageRefreshSeconds = 5;

std::string render_status_page(const StatusView& view);

// HTML-escapes text (&, <, >, ", ').
std::string html_escape(std::string_view text);

// The SVG polyline points of a sparkline of `values` (log10 scale between
// 1e-4 and 1, clamped) in a width x height box; "" for no values.
std::string sparkline_points(const std::vector<double>& values, int width, int height);

}  // namespace gaugewatch::agent
