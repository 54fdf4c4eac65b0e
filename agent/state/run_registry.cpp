#include "agent/state/run_registry.h"

#include <malloc.h>

#include <algorithm>

#include "agent/common/clock.h"

namespace gaugewatch::agent {

RunRegistry::RunRegistry(std::uint64_t max_series, std::size_t rule_count, std::size_t max_ranks)
    : max_series_(max_series), rule_count_(rule_count), max_ranks_(max_ranks) {}

std::shared_ptr<RankEntry> RunRegistry::connect(const gaugewatch::v1::Hello& hello,
                                                std::uint64_t session_id) {
  std::shared_ptr<RankEntry> entry;
  {
    std::lock_guard lock(mu_);
    const auto key = std::make_pair(hello.run_id(), hello.rank());
    auto it = ranks_.find(key);
    if (it == ranks_.end()) {
      if (max_ranks_ != 0 && ranks_.size() >= max_ranks_) return nullptr;
      it = ranks_.emplace(key, std::make_shared<RankEntry>()).first;
    }
    entry = it->second;
  }
  std::lock_guard lock(entry->mu);
  release(*entry);
  entry->run_id = hello.run_id();
  entry->rank = hello.rank();
  entry->hello = hello;
  entry->hello.clear_layers();
  entry->connected = true;
  entry->expired = false;
  entry->retired = false;
  entry->finished = false;
  entry->session_id = session_id;
  entry->last_seen_steady_ns = steady_now_ns();
  entry->last_seen_unix_ns = unix_now_ns();
  entry->layers.clear();
  entry->layers.resize(static_cast<std::size_t>(hello.layers_size()));
  entry->layer_count = static_cast<std::uint32_t>(hello.layers_size());
  for (int i = 0; i < hello.layers_size(); ++i) {
    auto& layer = entry->layers[static_cast<std::size_t>(i)];
    layer.name = hello.layers(i).name();
    layer.backend = hello.layers(i).backend();
    layer.rules.resize(rule_count_);
  }
  entry->attention_calls.clear();
  admit_rank(*entry);
  return entry;
}

void RunRegistry::record_attention_calls(RankEntry& rank,
                                         const gaugewatch::v1::AttentionCallCount& calls) {
  for (auto& row : rank.attention_calls) {
    if (row.monitored == calls.monitored() && row.reason == calls.reason()) {
      row.calls_total = calls.calls_total();
      return;
    }
  }
  if (rank.attention_calls.size() + 1 < kMaxAttentionCallRows) {
    rank.attention_calls.push_back({calls.monitored(), calls.reason(), calls.calls_total()});
    return;
  }
  // The last row takes every further reason: counts add up, series stay bounded.
  if (rank.attention_calls.size() + 1 == kMaxAttentionCallRows) {
    rank.attention_calls.push_back({false, "other", 0});
  }
  rank.attention_calls.back().calls_total += calls.calls_total();
}

void RunRegistry::disconnect(RankEntry& rank, std::uint64_t session_id) {
  std::lock_guard lock(rank.mu);
  if (rank.session_id == session_id) rank.connected = false;
}

bool RunRegistry::reserve(std::uint64_t series) {
  std::uint64_t current = exported_series_.load();
  while (true) {
    if (current + series > max_series_) {
      series_refused_.fetch_add(1);
      return false;
    }
    if (exported_series_.compare_exchange_weak(current, current + series)) return true;
  }
}

bool RunRegistry::admit(LayerEntry& layer) {
  if (layer.exported) return true;
  layer.exported = reserve(kSeriesPerLayer);
  return layer.exported;
}

bool RunRegistry::admit_rank(RankEntry& rank) {
  if (!rank.exported) rank.exported = reserve(kSeriesPerRank);
  return rank.exported;
}

void RunRegistry::release(RankEntry& rank) {
  if (rank.exported) {
    rank.exported = false;
    exported_series_.fetch_sub(kSeriesPerRank);
  }
  release_layers(rank);
}

void RunRegistry::release_layers(RankEntry& rank) {
  for (auto& layer : rank.layers) {
    if (layer.exported) {
      layer.exported = false;
      exported_series_.fetch_sub(kSeriesPerLayer);
    }
  }
}

std::size_t RunRegistry::expire(std::int64_t steady_now, std::int64_t expiry_ns) {
  std::size_t changed = 0;
  bool released_memory = false;
  std::vector<std::pair<std::string, std::uint32_t>> forget;
  for (const auto& rank : ranks()) {
    std::lock_guard lock(rank->mu);
    const std::int64_t silent = steady_now - rank->last_seen_steady_ns;
    if (!rank->retired && silent > expiry_ns) {
      rank->retired = true;
      // A rank that said Goodbye finished; only a silent one expired.
      if (!(rank->finished && !rank->connected)) {
        rank->expired = true;
        ++changed;
      }
      release_layers(*rank);  // its rank series stay: they say it expired or finished
      if (!rank->connected) {
        // Nobody reads a gone trainer's layers again: give their memory back now.
        std::vector<LayerEntry>().swap(rank->layers);
        released_memory = true;
      }
    }
    // Disconnected and silent for 10x the expiry time: forget the rank, so
    // finished runs do not accumulate.
    if (rank->retired && !rank->connected && silent / 10 > expiry_ns) {
      forget.emplace_back(rank->run_id, rank->rank);
    }
  }
  if (!forget.empty()) {
    std::lock_guard lock(mu_);
    for (const auto& key : forget) {
      auto it = ranks_.find(key);
      if (it == ranks_.end()) continue;
      const std::shared_ptr<RankEntry> keep = it->second;  // outlives the erase
      std::lock_guard rank_lock(keep->mu);
      if (keep->retired && !keep->connected) {
        release(*keep);
        ranks_.erase(it);
      }
    }
    released_memory = true;
  }
  // Freed layer tables are large and scattered: hand the pages back to the system.
  if (released_memory) ::malloc_trim(0);
  return changed;
}

std::vector<std::shared_ptr<RankEntry>> RunRegistry::ranks() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<RankEntry>> out;
  out.reserve(ranks_.size());
  for (const auto& [key, entry] : ranks_) out.push_back(entry);
  return out;
}

std::shared_ptr<RankEntry> RunRegistry::find(const std::string& run_id, std::uint32_t rank) const {
  std::lock_guard lock(mu_);
  auto it = ranks_.find({run_id, rank});
  return it == ranks_.end() ? nullptr : it->second;
}

void RunRegistry::list(const gaugewatch::v1::ListRunsRequest& request,
                       gaugewatch::v1::ListRunsResponse& response) const {
  gaugewatch::v1::RunState* run = nullptr;
  for (const auto& entry : ranks()) {
    std::lock_guard lock(entry->mu);
    if (!request.run_id().empty() && entry->run_id != request.run_id()) continue;
    if (run == nullptr || run->run_id() != entry->run_id) {
      run = response.add_runs();
      run->set_run_id(entry->run_id);
    }
    auto* rank = run->add_ranks();
    const auto& hello = entry->hello;
    rank->set_rank(entry->rank);
    rank->set_local_rank(hello.local_rank());
    rank->set_world_size(hello.world_size());
    rank->set_host(hello.host());
    rank->set_pid(hello.pid());
    rank->set_torch_version(hello.torch_version());
    rank->set_cuda_version(hello.cuda_version());
    rank->set_driver_version(hello.driver_version());
    rank->set_connected(entry->connected);
    rank->set_finished(entry->finished);
    rank->set_expired(entry->expired);
    rank->set_last_seen_unix_time_ns(entry->last_seen_unix_ns);
    rank->set_samples(entry->samples);
    rank->set_hook_dropped_total(entry->hook_dropped);
    rank->set_samples_shed_total(entry->samples_shed);
    rank->set_layer_count(entry->layer_count);
    if (!request.include_layers()) continue;
    const std::size_t limit = std::min<std::size_t>(
        request.layer_limit() == 0 ? kDefaultLayerPage : request.layer_limit(), kMaxLayerPage);
    const std::size_t begin = std::min<std::size_t>(request.layer_offset(), entry->layers.size());
    const std::size_t end = std::min(entry->layers.size(), begin + limit);
    for (std::size_t i = begin; i < end; ++i) {
      const auto& layer = entry->layers[i];
      auto* out = rank->add_layers();
      out->set_index(static_cast<std::uint32_t>(i));
      out->set_name(layer.name);
      out->set_backend(layer.backend);
      out->set_desired_backend(layer.desired);
      out->set_last_step(layer.last_step);
      out->set_samples(layer.samples);
      out->set_last_unix_time_ns(layer.last_unix_ns);
      to_proto(layer.latest, *out->mutable_latest());
      out->set_monitored(layer.monitored);
      out->set_unmonitored_reason(layer.unmonitored_reason);
      for (const auto backend : layer.correcting_backends) out->add_correcting_backends(backend);
    }
  }
}

}  // namespace gaugewatch::agent
