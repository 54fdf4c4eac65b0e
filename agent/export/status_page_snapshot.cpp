#include "agent/export/status_page_snapshot.h"

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include "agent/common/backend_names.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;
using reference::MetricId;

namespace {

std::optional<double> metric(const MetricValues& values, MetricId id) {
  const auto i = static_cast<std::size_t>(id);
  if (!values.present.test(i)) return std::nullopt;
  return values.value[i];
}

const char* source_name(v1::DecisionSource source) {
  switch (source) {
    case v1::DECISION_SOURCE_ADMIN: return "admin";
    case v1::DECISION_SOURCE_RULE: return "rule";
    case v1::DECISION_SOURCE_PROMQL_RULE: return "promql_rule";
    default: return "unknown";
  }
}

StatusRank::State rank_state(const RankEntry& rank) {
  if (rank.finished) return StatusRank::State::kFinished;
  if (rank.expired) return StatusRank::State::kSilent;
  return rank.connected ? StatusRank::State::kConnected : StatusRank::State::kDisconnected;
}

// Caller holds rank.mu.
StatusRank status_rank(const RankEntry& rank) {
  StatusRank out;
  out.rank = rank.rank;
  out.local_rank = rank.hello.local_rank();
  out.host = rank.hello.host();
  out.gpu_uuid = rank.hello.gpu_uuid();
  out.pci_bus_id = rank.hello.pci_bus_id();
  out.state = rank_state(rank);
  for (const auto& calls : rank.attention_calls) {
    if (calls.monitored) {
      out.monitored_calls += calls.calls_total;
    } else {
      out.unmonitored_calls.push_back({calls.reason, calls.calls_total});
    }
  }
  for (std::size_t i = 0; i < rank.layers.size(); ++i) {
    const LayerEntry& entry = rank.layers[i];
    StatusLayer layer;
    layer.index = static_cast<std::uint32_t>(i);
    layer.name = entry.name;
    layer.backend = std::string(backend_name(entry.backend));
    if (entry.desired != v1::BACKEND_UNSPECIFIED) layer.desired = std::string(backend_name(entry.desired));
    layer.monitored = entry.monitored;
    layer.unmonitored_reason = entry.unmonitored_reason;
    layer.live_dq = metric(entry.latest, MetricId::kLiveDqDiscrepancy);
    layer.gproj_dq = metric(entry.latest, MetricId::kGprojDqDiscrepancy);
    layer.offset_ratio = metric(entry.latest, MetricId::kKeyOffsetSpreadRatioMedian);
    layer.samples = entry.samples;
    layer.recent_live_dq = entry.recent_live_dq.oldest_first();
    out.layers.push_back(std::move(layer));
  }
  return out;
}

StatusDecision status_decision(const v1::Decision& decision) {
  StatusDecision out;
  out.time_unix_ns = decision.unix_time_ns();
  const auto& target = decision.target();
  if (!target.all_runs()) out.run = target.run_id();
  if (target.has_rank()) out.rank = target.rank();
  out.layers.assign(target.layers().begin(), target.layers().end());
  out.backend = std::string(backend_name(decision.backend()));
  out.source = source_name(decision.source());
  out.reason = decision.reason().empty() ? decision.rule() : decision.reason();
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string url_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '+') {
      out += ' ';
    } else if (text[i] == '%' && i + 2 < text.size() && hex_value(text[i + 1]) >= 0 &&
               hex_value(text[i + 2]) >= 0) {
      out += static_cast<char>(hex_value(text[i + 1]) * 16 + hex_value(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace

StatusView build_status_view(const StatusSources& sources, const std::vector<std::string>& runs) {
  StatusView view;
  view.agent_version = std::string(sources.agent_version);
  view.now_unix_ns = sources.now_unix_ns;
  view.trainers_connected = sources.trainers_connected;
  const std::set<std::string> wanted(runs.begin(), runs.end());
  for (const auto& rank : sources.registry.ranks()) {  // sorted by (run, rank)
    std::lock_guard lock(rank->mu);
    if (!wanted.empty() && !wanted.count(rank->run_id)) continue;
    if (view.runs.empty() || view.runs.back().run != rank->run_id) view.runs.push_back({rank->run_id, {}});
    view.runs.back().ranks.push_back(status_rank(*rank));
  }
  for (const auto& decision : sources.decisions) {
    StatusDecision d = status_decision(decision);
    if (!wanted.empty() && !d.run.empty() && !wanted.count(d.run)) continue;
    view.decisions.push_back(std::move(d));
  }
  return view;
}

std::vector<std::string> runs_from_query(std::string_view query) {
  std::vector<std::string> runs;
  std::size_t start = 0;
  while (start <= query.size()) {
    const std::size_t end = std::min(query.find('&', start), query.size());
    const std::string_view pair = query.substr(start, end - start);
    if (pair.starts_with("run=")) {
      const std::string value = url_decode(pair.substr(4));
      std::size_t from = 0;
      while (from <= value.size()) {
        const std::size_t comma = std::min(value.find(',', from), value.size());
        if (comma > from) runs.push_back(value.substr(from, comma - from));
        from = comma + 1;
      }
    }
    start = end + 1;
  }
  return runs;
}

}  // namespace gaugewatch::agent
