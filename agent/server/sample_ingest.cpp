#include "agent/server/sample_ingest.h"

#include "agent/common/clock.h"

namespace gaugewatch::agent {

namespace v1 = gaugewatch::v1;

Verdict SampleIngest::apply(Session& session, const v1::SampleBatch& batch, std::vector<RuleFiring>& fired) {
  const auto samples = static_cast<std::size_t>(batch.samples_size());
  RankEntry& rank = *session.rank;
  std::size_t admitted = 0;
  std::uint64_t skewed = 0;
  SampleAgeBatch ages;
  {
    std::lock_guard lock(rank.mu);
    if (rank.session_id != session.id()) {
      return {RejectReason::kOutOfOrder, "stream superseded by a newer connection of the same run and rank"};
    }
    rank.last_seen_steady_ns = steady_now_ns();
    rank.last_seen_unix_ns = unix_now_ns();
    rank.expired = false;
    rank.retired = false;
    // Rate limit per stream: the first `admitted` samples are applied, the
    // rest are dropped and counted. Never waits, so no other stream is held up.
    admitted = static_cast<std::size_t>(session.sample_bucket.take(samples, rank.last_seen_steady_ns));
    if (admitted < samples) rank.samples_shed += samples - admitted;
    rank.samples += admitted;
    if (batch.dropped_total() > rank.hook_dropped) {
      counters_.hook_dropped_total.Increment(static_cast<double>(batch.dropped_total() - rank.hook_dropped));
      rank.hook_dropped = batch.dropped_total();
    }
    if (batch.current_step() != 0) {
      rank.current_step = batch.current_step();
      run_steps_.observe(rank.run_id, rank.rank, batch.current_step(), rank.last_seen_steady_ns);
    }
    for (const auto& calls : batch.attention_calls()) RunRegistry::record_attention_calls(rank, calls);
    for (const auto& status : batch.layer_status()) {
      LayerEntry& layer = rank.layers[status.layer()];
      layer.monitored = status.monitored();
      layer.unmonitored_reason = status.reason();
      layer.correcting_backends.clear();
      for (const int backend : status.correcting_backends()) {
        layer.correcting_backends.push_back(static_cast<v1::Backend>(backend));
      }
    }
    std::uint64_t evaluations = 0;
    const std::int64_t now_unix = rank.last_seen_unix_ns;
    const std::int64_t skew_ns = static_cast<std::int64_t>(config_.limits.max_clock_skew_seconds) * 1'000'000'000;
    for (std::size_t s = 0; s < admitted; ++s) {
      const auto& sample = batch.samples(static_cast<int>(s));
      // A stamp outside the skew window (a wrong clock, or a forged value)
      // would poison the age histogram: count it and use the agent's time.
      const std::int64_t stamp = sample.unix_time_ns();
      const bool stamped = stamp != 0;
      const bool in_window = stamped && stamp > now_unix - skew_ns && stamp < now_unix + skew_ns;
      if (stamped && !in_window) ++skewed;
      if (in_window) ages.add(now_unix - stamp);
      LayerEntry& layer = rank.layers[sample.layer()];
      layer.latest = to_values(sample.metrics());
      if (layer.latest.present.test(static_cast<std::size_t>(reference::MetricId::kLiveDqDiscrepancy))) {
        layer.recent_live_dq.add(layer.latest.value[static_cast<std::size_t>(reference::MetricId::kLiveDqDiscrepancy)]);
      }
      layer.backend = sample.backend();
      layer.last_step = sample.step();
      layer.last_unix_ns = in_window ? stamp : now_unix;
      if (sample.correcting_backends_size() > 0) {
        layer.correcting_backends.clear();
        for (const int backend : sample.correcting_backends()) {
          layer.correcting_backends.push_back(static_cast<v1::Backend>(backend));
        }
      }
      ++layer.samples;
      registry_.admit(layer);
      const SampleView view{rank.run_id, rank.rank, sample.layer(), sample.step(), layer};
      for (std::size_t r = 0; r < rules_.size(); ++r) {
        if (rules_[r]->evaluate(view, layer.rules[r], fired)) ++evaluations;
      }
    }
    counters_.rule_evaluations_total.Increment(static_cast<double>(evaluations));
  }
  counters_.observe(ages);
  if (skewed > 0) counters_.samples_clock_skew_total.Increment(static_cast<double>(skewed));
  counters_.samples_received_total.Increment(static_cast<double>(admitted));
  if (admitted < samples) {
    counters_.samples_shed_total[static_cast<std::size_t>(ShedReason::kRateLimit)]->Increment(
        static_cast<double>(samples - admitted));
  }
  return {};
}

}  // namespace gaugewatch::agent
