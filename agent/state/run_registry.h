#pragma once
// Runs > ranks > layers, with each layer's latest metrics and backend. One
// RankEntry per (run, rank); its mutex guards everything in it, so trainers
// of different ranks never contend. The registry's own mutex guards only the
// map. Ranks that send nothing for the expiry time are marked expired and
// give their exported series back to the cardinality guard.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "agent/state/metric_fields.h"
#include "agent/state/recent_values.h"
#include "gaugewatch/v1/admin_service.pb.h"
#include "gaugewatch/v1/hook_service.pb.h"

namespace gaugewatch::agent {

struct RuleState {
  std::uint32_t consecutive = 0;
  bool firing = false;
};

struct LayerEntry {
  std::string name;
  gaugewatch::v1::Backend backend = gaugewatch::v1::BACKEND_UNSPECIFIED;
  gaugewatch::v1::Backend desired = gaugewatch::v1::BACKEND_UNSPECIFIED;
  std::uint64_t last_step = 0;
  std::uint64_t samples = 0;
  std::int64_t last_unix_ns = 0;
  MetricValues latest;
  RecentValues recent_live_dq;  // the last samples' live dQ discrepancy
  bool exported = false;  // admitted by the cardinality guard
  std::vector<RuleState> rules;
  // What the hook reports about the layer (SampleBatch.layer_status).
  bool monitored = true;
  std::string unmonitored_reason;
  std::vector<gaugewatch::v1::Backend> correcting_backends;
};

// One (monitored, reason) row of the hook's attention-call counts.
struct AttentionCalls {
  bool monitored = false;
  std::string reason;
  std::uint64_t calls_total = 0;
};

struct RankEntry {
  mutable std::mutex mu;
  std::string run_id;
  std::uint32_t rank = 0;
  gaugewatch::v1::Hello hello;  // without layers
  bool connected = false;
  bool expired = false;
  bool finished = false;   // the trainer said Goodbye: it ended cleanly
  bool retired = false;    // silent past the expiry time: layer series released
  bool exported = false;   // its per-rank series admitted by the cardinality guard
  std::uint64_t session_id = 0;
  std::int64_t last_seen_steady_ns = 0;
  std::int64_t last_seen_unix_ns = 0;
  std::uint64_t samples = 0;
  std::uint64_t hook_dropped = 0;
  std::uint64_t samples_shed = 0;  // valid samples discarded by the stream's rate limit
  std::vector<LayerEntry> layers;  // emptied when an expired, disconnected rank is let go
  std::uint32_t layer_count = 0;   // the Hello's layer count (kept when `layers` is emptied)
  std::vector<AttentionCalls> attention_calls;  // at most kMaxAttentionCallRows
};

class RunRegistry {
 public:
  // Series each exported layer may occupy: its metrics, backend info, samples.
  static constexpr std::uint64_t kSeriesPerLayer = reference::kMetricCount + 2;
  // Distinct (monitored, reason) rows of attention-call counts kept per rank;
  // further reasons are counted under reason "other".
  static constexpr std::size_t kMaxAttentionCallRows = 8;
  // Series each exported rank may occupy: seven gaugewatch_rank_* gauges,
  // counters and its info series, plus its attention-call rows.
  static constexpr std::uint64_t kSeriesPerRank = 7 + kMaxAttentionCallRows;

  // max_ranks: most (run, rank) entries held at once (0: no limit).
  RunRegistry(std::uint64_t max_series, std::size_t rule_count, std::size_t max_ranks = 0);

  // Registers (or re-registers) the rank of `hello` for a new session. The
  // layer list is replaced by the Hello's. Returns null when the rank is new
  // and max_ranks entries are held already.
  std::shared_ptr<RankEntry> connect(const gaugewatch::v1::Hello& hello, std::uint64_t session_id);
  // Caller holds rank.mu. Adds the hook's attention-call counts (cumulative
  // per (monitored, reason): the latest value wins).
  static void record_attention_calls(RankEntry& rank, const gaugewatch::v1::AttentionCallCount& calls);
  // Marks the rank disconnected if `session_id` is still its session.
  void disconnect(RankEntry& rank, std::uint64_t session_id);

  // Caller holds rank.mu. Admits the layer's series if the guard allows;
  // returns false (and counts a refusal) when the limit is reached.
  bool admit(LayerEntry& layer);
  // Caller holds rank.mu. Releases every exported series of the rank
  // (release_layers: only its layers' series).
  void release(RankEntry& rank);
  void release_layers(RankEntry& rank);

  // Marks ranks silent for longer than `expiry_ns` expired (releasing their
  // series and, when disconnected, their layers' memory); forgets
  // disconnected ranks silent for 10x that. Returns how many ranks expired.
  std::size_t expire(std::int64_t steady_now_ns, std::int64_t expiry_ns);

  std::vector<std::shared_ptr<RankEntry>> ranks() const;  // sorted by (run, rank)
  std::shared_ptr<RankEntry> find(const std::string& run_id, std::uint32_t rank) const;

  // Layers per rank in one ListRuns reply: by default, and at most.
  static constexpr std::size_t kDefaultLayerPage = 256;
  static constexpr std::size_t kMaxLayerPage = 4096;

  std::uint64_t exported_series() const { return exported_series_.load(); }
  std::uint64_t series_refused() const { return series_refused_.load(); }
  std::uint64_t max_series() const { return max_series_; }

  void list(const gaugewatch::v1::ListRunsRequest& request,
            gaugewatch::v1::ListRunsResponse& response) const;

 private:
  // Caller holds rank.mu. Admits the rank's own series if the guard allows.
  bool admit_rank(RankEntry& rank);
  bool reserve(std::uint64_t series);

  const std::uint64_t max_series_;
  const std::size_t rule_count_;
  const std::size_t max_ranks_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::uint32_t>, std::shared_ptr<RankEntry>> ranks_;
  std::atomic<std::uint64_t> exported_series_{0};
  std::atomic<std::uint64_t> series_refused_{0};
};

}  // namespace gaugewatch::agent
