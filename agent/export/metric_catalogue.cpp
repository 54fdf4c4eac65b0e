#include "agent/export/metric_catalogue.h"

#include <stdexcept>

namespace gaugewatch::agent {

namespace {

constexpr std::size_t kAgentMetricCount = static_cast<std::size_t>(AgentMetric::kCount);

std::vector<ExportedMetric> build() {
  std::vector<ExportedMetric> out;
  for (const auto& spec : reference::metric_catalogue()) {
    // Base units: a dimensionless ratio carries the _ratio suffix; norms and
    // logits are in the units of the activations and carry none.
    const bool ratio = spec.unit == "ratio";
    out.push_back({"gaugewatch_layer_" + std::string(spec.name) + (ratio ? "_ratio" : ""),
                   MetricType::kGauge, ratio ? "ratio" : "",
                   std::string(spec.help) + " Latest audited sample.", "run,rank,layer"});
  }
  const std::vector<ExportedMetric> agent = {
      {"gaugewatch_layer_backend_info", MetricType::kInfo, "",
       "Backend a layer runs (backend) and the one decisions ask for (desired).",
       "run,rank,layer,name,backend,desired"},
      {"gaugewatch_layer_samples_total", MetricType::kCounter, "",
       "Audited samples received for a layer.", "run,rank,layer"},
      {"gaugewatch_rank_connected", MetricType::kGauge, "",
       "1 while the rank's trainer has a stream open.", "run,rank"},
      {"gaugewatch_rank_expired", MetricType::kGauge, "",
       "1 once the rank sent nothing for the expiry time; its layer series are dropped.",
       "run,rank"},
      {"gaugewatch_rank_last_seen_timestamp_seconds", MetricType::kGauge, "seconds",
       "Unix time of the rank's last message.", "run,rank"},
      {"gaugewatch_rank_hook_dropped_samples_total", MetricType::kCounter, "",
       "Samples the rank's hook dropped from its bounded queue.", "run,rank"},
      {"gaugewatch_rank_samples_shed_total", MetricType::kCounter, "",
       "Valid samples of the rank the agent discarded (its stream's rate limit).", "run,rank"},
      {"gaugewatch_agent_build_info", MetricType::kInfo, "", "Agent version.", "version"},
      {"gaugewatch_agent_start_time_seconds", MetricType::kGauge, "seconds",
       "Unix time the agent started.", ""},
      {"gaugewatch_agent_trainers_connected", MetricType::kGauge, "",
       "Trainer streams open now.", ""},
      {"gaugewatch_agent_connections_total", MetricType::kCounter, "",
       "Trainer streams accepted.", ""},
      {"gaugewatch_agent_samples_received_total", MetricType::kCounter, "",
       "Samples accepted.", ""},
      {"gaugewatch_agent_samples_rejected_total", MetricType::kCounter, "",
       "Samples in messages that failed validation.", ""},
      {"gaugewatch_agent_samples_dropped_total", MetricType::kCounter, "",
       "Samples trainers' hooks reported dropped.", ""},
      {"gaugewatch_agent_commands_dropped_total", MetricType::kCounter, "",
       "Commands not delivered: stream closed or outbox full.", ""},
      {"gaugewatch_agent_messages_rejected_total", MetricType::kCounter, "",
       "Trainer messages that failed validation, by reason.", "reason"},
      {"gaugewatch_agent_commands_sent_total", MetricType::kCounter, "",
       "Commands queued to trainers.", ""},
      {"gaugewatch_agent_switches_total", MetricType::kCounter, "",
       "Backend switch commands queued to trainers.", ""},
      {"gaugewatch_agent_command_acks_total", MetricType::kCounter, "",
       "Command acknowledgements, by status (applied, rejected, unknown).", "status"},
      {"gaugewatch_agent_decisions_total", MetricType::kCounter, "",
       "Switch decisions recorded, by source (admin, rule, promql_rule).", "source"},
      {"gaugewatch_agent_rule_evaluations_total", MetricType::kCounter, "",
       "Threshold rule evaluations.", ""},
      {"gaugewatch_agent_rule_firings_total", MetricType::kCounter, "",
       "Threshold rule firings.", ""},
      {"gaugewatch_agent_promql_queries_total", MetricType::kCounter, "",
       "PromQL rule queries sent.", ""},
      {"gaugewatch_agent_promql_errors_total", MetricType::kCounter, "",
       "PromQL rule queries that failed.", ""},
      {"gaugewatch_agent_store_errors_total", MetricType::kCounter, "",
       "SQLite writes that failed.", ""},
      {"gaugewatch_agent_series", MetricType::kGauge, "",
       "Per-layer series admitted by the cardinality guard.", ""},
      {"gaugewatch_agent_series_limit", MetricType::kGauge, "",
       "Cardinality guard limit (max_series).", ""},
      {"gaugewatch_agent_series_refused_total", MetricType::kCounter, "",
       "Samples whose layer series the cardinality guard refused.", ""},
      {"gaugewatch_agent_ranks_expired_total", MetricType::kCounter, "",
       "Ranks expired for silence.", ""},
      {"gaugewatch_agent_scrapes_total", MetricType::kCounter, "", "Scrapes of /metrics.", ""},
      {"gaugewatch_agent_scrape_duration_seconds", MetricType::kGauge, "seconds",
       "Time the previous /metrics rendering took.", ""},
      {"gaugewatch_agent_sample_age_seconds", MetricType::kHistogram, "seconds",
       "Time from a trainer stamping a sample to the agent applying it.", "le"},
      {"gaugewatch_agent_samples_shed_total", MetricType::kCounter, "",
       "Valid samples the agent discarded, by reason (rate_limit: a trainer stream over "
       "trainer_sample_rate).",
       "reason"},
      {"gaugewatch_agent_store_pruned_rows_total", MetricType::kCounter, "",
       "SQLite rows deleted by retention, by table (audit, decisions).", "table"},
      {"gaugewatch_agent_store_rows", MetricType::kGauge, "",
       "SQLite rows after the last retention pass, by table (audit, decisions).", "table"},
      {"gaugewatch_agent_retention_runs_total", MetricType::kCounter, "",
       "Retention passes over the SQLite store.", ""},
      {"gaugewatch_agent_hook_streams_unauthenticated_total", MetricType::kCounter, "",
       "Trainer streams over TCP refused for a missing or wrong bearer token.", ""},
  };
  if (agent.size() != kAgentMetricCount) throw std::logic_error("agent metric table size");
  out.insert(out.end(), agent.begin(), agent.end());
  return out;
}

}  // namespace

const std::vector<ExportedMetric>& exported_catalogue() {
  static const std::vector<ExportedMetric> catalogue = build();
  return catalogue;
}

const ExportedMetric& layer_metric(reference::MetricId id) {
  return exported_catalogue()[static_cast<std::size_t>(id)];
}

const ExportedMetric& agent_metric(AgentMetric id) {
  return exported_catalogue()[reference::kMetricCount + static_cast<std::size_t>(id)];
}

std::string_view family_name(const ExportedMetric& metric) {
  std::string_view name = metric.name;
  if (metric.type == MetricType::kCounter && name.ends_with("_total")) {
    name.remove_suffix(6);
  } else if (metric.type == MetricType::kInfo && name.ends_with("_info")) {
    name.remove_suffix(5);
  }
  return name;
}

}  // namespace gaugewatch::agent
