// The stats JSON (runtime.h, docs/hooks.md "Stats"): what stats(), the
// C++ API and GAUGEWATCH_STATS_FILE (rewritten at every step boundary and
// at exit) show.
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "hooks/cupti_timing.h"
#include "hooks/log.h"
#include "hooks/runtime.h"

namespace gaugewatch::hooks {

std::string Runtime::stats_json_locked() {
  nlohmann::json j;
  j["run_id"] = config_.run_id;
  j["rank"] = config_.rank;
  j["world_size"] = config_.world_size;
  j["step"] = step_;
  j["passes"] = passes_;
  j["frozen"] = frozen_;
  j["step_mode"] = optimizer_mode_ ? "optimizer" : "backward";
  j["grad_accum"] = config_.grad_accum;
  j["optimizer_steps"] = optimizer_steps_;
  j["backward_passes"] = backward_passes_ + (pass_had_backward_ ? 1 : 0);
  j["forked_child"] = forked_child_;
  j["cuda_backends"] = backend_status_;
  j["timing"] = {{"source", timing_source_},
                 {"cupti", cupti_status_},
                 {"samples_by_source", timed_by_},
                 {"cupti_busy_skips", cupti::busy_skips()}};
  nlohmann::json calls = nlohmann::json::object();
  for (const BackendSpec& b : kBackends) {
    if (b.layer) calls[std::string(b.name)] = backward_calls_[static_cast<std::size_t>(b.id)];
  }
  j["backward_calls"] = calls;
  j["fallbacks"] = fallbacks_;
  j["samples_submitted"] = samples_submitted_;
  j["audits_skipped_budget"] = audits_skipped_budget_;
  j["audits_skipped_other"] = audits_skipped_other_;
  j["audits_skipped_reasons"] = audits_skipped_reasons_;
  j["audit_us_total"] = audit_us_total_;
  j["audits_by_device"] = audits_by_device_;
  nlohmann::json attention_calls = nlohmann::json::array();
  for (const AttentionCallCount& c : coverage_.report(0).calls) {
    attention_calls.push_back({{"monitored", c.monitored}, {"reason", c.reason}, {"calls", c.calls}});
  }
  j["attention_calls"] = attention_calls;
  j["coverage"] = coverage_.summary();
  j["commands_applied"] = commands_applied_;
  j["commands_rejected"] = commands_rejected_;
  j["sampling"] = {{"every_n_steps", every_n_steps_},
                   {"layer_fraction", layer_fraction_},
                   {"max_heads", max_heads_},
                   {"max_rows", max_rows_},
                   {"overhead_budget", overhead_budget_}};
  if (reporter_) {
    j["reporter"] = {{"connected", reporter_->connected()},
                     {"connects", reporter_->connects()},
                     {"samples_sent", reporter_->sent()},
                     {"samples_dropped", reporter_->dropped()},
                     {"commands_received", reporter_->commands_received()}};
  } else {
    j["reporter"] = nullptr;
  }
  nlohmann::json layers = nlohmann::json::array();
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const LayerRecord& l = layers_[i];
    nlohmann::json history = nlohmann::json::array();
    for (const auto& [step, backend] : l.history) history.push_back({step, std::string(backend_name(backend))});
    // The latest sample's reportable metrics, by their catalogue names.
    nlohmann::json latest = nlohmann::json::object();
    if (l.latest_step >= 0) {
      latest["step"] = l.latest_step;
      const auto& catalogue = reference::metric_catalogue();
      for (std::size_t m = 0; m < catalogue.size(); ++m) {
        if (reportable(l.latest[m])) latest[std::string(catalogue[m].name)] = l.latest[m];
      }
    }
    nlohmann::json status = nullptr;  // before the layer's first training call
    if (const LayerStatus* st = coverage_.layer(i)) {
      nlohmann::json correcting = nlohmann::json::array();
      for (Backend b : st->correcting_backends) correcting.push_back(std::string(backend_name(b)));
      status = {{"monitored", st->monitored}, {"reason", st->reason}, {"correcting_backends", correcting}};
    }
    layers.push_back({{"index", i},
                      {"coverage", status},
                      {"name", l.name},
                      {"backend", std::string(backend_name(l.backend))},
                      {"cuda", l.cuda},
                      {"backward_calls", l.backward_calls},
                      {"samples", l.samples},
                      {"last_backward_step", l.last_backward_step},
                      {"history", history},
                      {"latest", latest}});
  }
  j["layers"] = layers;
  return j.dump();
}

std::string Runtime::stats_json() {
  std::lock_guard lock(mu_);
  return stats_json_locked();
}

void Runtime::write_stats_file() {
  std::lock_guard lock(mu_);
  write_stats_file_locked();
}

void Runtime::write_stats_file_locked() {
  // A process that never made a training attention call writes nothing:
  // under LD_PRELOAD every program the trainer starts (a shell, a tool, the
  // test watchdog) loads the library, and must not overwrite the trainer's
  // file. Calls the hooks do not monitor (the math path) count: their
  // coverage is what the file then shows.
  if (config_.stats_file.empty() || forked_child_ || (!started_ && coverage_.total_calls() == 0)) return;
  const std::string tmp = config_.stats_file + ".tmp";
  {
    std::ofstream out(tmp);
    out << stats_json_locked() << "\n";
    if (!out) {
      log_once("stats-write", "cannot write the stats file " + tmp + ": stats are not saved (logged once)");
      return;
    }
  }
  std::rename(tmp.c_str(), config_.stats_file.c_str());
}

}  // namespace gaugewatch::hooks
