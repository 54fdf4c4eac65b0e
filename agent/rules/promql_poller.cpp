#include "agent/rules/promql_poller.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdio>
#include <stdexcept>

#include "agent/common/backend_names.h"
#include "agent/common/clock.h"
#include "agent/common/label_safe.h"
#include "agent/export/http_server.h"
#include "agent/rules/effective_step.h"
#include "agent/store/decision_store.h"

namespace gaugewatch::agent {

namespace {

std::string url_encode(std::string_view text) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char ch : text) {
    if (std::isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out += static_cast<char>(ch);
    } else {
      out += '%';
      out += kHex[ch >> 4];
      out += kHex[ch & 15];
    }
  }
  return out;
}

bool parse_u32(const std::string& text, std::uint32_t& out) {
  if (text.empty() || text.size() > 9) return false;
  std::uint32_t value = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
    value = value * 10 + static_cast<std::uint32_t>(ch - '0');
  }
  out = value;
  return true;
}

}  // namespace

std::vector<PromqlSeries> parse_promql_response(const std::string& json) {
  google::protobuf::Struct root;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(json, &root, options).ok()) {
    throw std::runtime_error("Prometheus answer is not JSON");
  }
  const auto& fields = root.fields();
  auto status = fields.find("status");
  if (status == fields.end() || status->second.string_value() != "success") {
    auto error = fields.find("error");
    throw std::runtime_error("Prometheus query failed: " +
                             (error != fields.end() ? error->second.string_value() : "no status"));
  }
  auto data = fields.find("data");
  if (data == fields.end()) throw std::runtime_error("Prometheus answer has no data");
  const auto& data_fields = data->second.struct_value().fields();
  auto type = data_fields.find("resultType");
  if (type == data_fields.end() || type->second.string_value() != "vector") {
    throw std::runtime_error("PromQL rule query must return an instant vector");
  }
  std::vector<PromqlSeries> out;
  auto result = data_fields.find("result");
  if (result == data_fields.end()) return out;
  for (const auto& item : result->second.list_value().values()) {
    const auto& item_fields = item.struct_value().fields();
    PromqlSeries series;
    if (auto metric = item_fields.find("metric"); metric != item_fields.end()) {
      for (const auto& [name, value] : metric->second.struct_value().fields()) {
        series.labels[name] = value.string_value();
      }
    }
    auto value = item_fields.find("value");
    if (value == item_fields.end() || value->second.list_value().values_size() != 2) continue;
    const std::string text = value->second.list_value().values(1).string_value();
    series.value = std::strtod(text.c_str(), nullptr);
    out.push_back(std::move(series));
  }
  return out;
}

PromqlPoller::PromqlPoller(const AgentConfig& config, DecisionSink& decisions, AgentCounters& counters)
    : rules_(config.promql_rules),
      decisions_(decisions),
      counters_(counters),
      max_run_id_bytes_(config.limits.max_run_id_bytes),
      states_(config.promql_rules.size()),
      interval_s_(std::max(1.0, std::ceil(config.promql_interval_seconds))) {
  if (rules_.empty()) return;
  // http://host:port[/prefix]
  std::string rest = config.prometheus_url.substr(std::string("http://").size());
  const auto slash = rest.find('/');
  base_path_ = slash == std::string::npos ? "" : rest.substr(slash);
  while (!base_path_.empty() && base_path_.back() == '/') base_path_.pop_back();
  rest = rest.substr(0, slash);
  const auto colon = rest.rfind(':');
  host_ = colon == std::string::npos ? rest : rest.substr(0, colon);
  std::uint32_t port = 80;
  if (colon != std::string::npos && (!parse_u32(rest.substr(colon + 1), port) || port > 65535)) {
    throw ConfigError("prometheus_url: bad port in '" + config.prometheus_url + "'");
  }
  port_ = static_cast<std::uint16_t>(port);
}

namespace {
// Instants an agent that was away evaluates when it is back, at most.
constexpr std::size_t kMaxCatchUp = 10;
}  // namespace

std::vector<PromqlSeries> PromqlPoller::query(const std::string& promql, std::int64_t instant) {
  const auto answer = http_get(host_, port_, base_path_ + "/api/v1/query?query=" + url_encode(promql) +
                                                 "&time=" + std::to_string(instant));
  if (answer.status != 200 && answer.status != 400 && answer.status != 422) {
    throw std::runtime_error("HTTP " + std::to_string(answer.status));
  }
  return parse_promql_response(answer.body);
}

void PromqlPoller::poll_once() {
  auto& counters = counters_;
  const double now_s = static_cast<double>(unix_now_ns()) / 1e9;
  const std::int64_t latest = aligned_instant(now_s, interval_s_, 2.0 * interval_s_);
  for (std::size_t i = 0; i < rules_.size(); ++i) {
    RuleState& state = states_[i];
    for (const std::int64_t instant : instants_to_evaluate(state.last_instant, latest, interval_s_, kMaxCatchUp)) {
      counters.promql_queries_total.Increment();
      try {
        evaluate(rules_[i], state, query(rules_[i].query, instant), instant);
        state.last_instant = instant;
      } catch (const std::exception& e) {
        counters.promql_errors_total.Increment();
        std::fprintf(stderr, "gaugewatch-agent: PromQL rule %s at %lld: %s\n", rules_[i].name.c_str(),
                     static_cast<long long>(instant), e.what());
        break;  // this instant again at the next poll
      }
    }
  }
}

std::uint64_t PromqlPoller::fleet_step(const std::string& run_id, std::int64_t instant) {
  const std::string selector = "gaugewatch_rank_step{run=\"" + run_id + "\"}";
  const auto steps = query("max(" + selector + ")", instant);
  if (steps.empty()) return 0;  // no rank of the run reported a step: each process at its next boundary
  const auto rates = query("max(deriv(" + selector + "[1m]))", instant);
  const double rate = rates.empty() || std::isnan(rates[0].value) ? 0.0 : rates[0].value;
  // From T until every agent has polled (two intervals of settle, one of
  // polling) and delivered.
  const double horizon_s = 3.0 * interval_s_ + delivery_s_;
  return fleet_effective_step(steps[0].value, rate, horizon_s, EffectiveStepMargin{}.lead_steps);
}

void PromqlPoller::evaluate(const PromqlRule& rule, RuleState& state,
                            const std::vector<PromqlSeries>& result, std::int64_t instant) {
  std::map<std::string, std::uint32_t> seen;
  for (const auto& series : result) {
    if (series.value == 0.0 || std::isnan(series.value)) continue;
    auto layer_label = series.labels.find("layer");
    std::uint32_t layer = 0;
    if (layer_label == series.labels.end() || !parse_u32(layer_label->second, layer)) continue;
    gaugewatch::v1::Target target;
    if (auto run = series.labels.find("run"); run != series.labels.end()) {
      if (!is_label_safe(run->second, max_run_id_bytes_)) continue;
      target.set_run_id(run->second);
    } else {
      target.set_all_runs(true);
    }
    if (auto rank = series.labels.find("rank"); rank != series.labels.end()) {
      std::uint32_t value = 0;
      if (!parse_u32(rank->second, value)) continue;
      target.set_rank(value);
    }
    target.add_layers(layer);
    const std::string key = target.SerializeAsString();
    const std::uint32_t count = state.consecutive[key] + 1;
    seen[key] = count;
    if (count < rule.for_polls || state.fired.count(key)) continue;
    // A run-wide decision's step comes from Prometheus at the firing
    // instant (a failed query throws: the instant is evaluated again).
    std::optional<std::uint64_t> effective_step;
    if (!target.run_id().empty() && !target.has_rank()) effective_step = fleet_step(target.run_id(), instant);
    state.fired.insert(key);
    try {
      decisions_.decide({gaugewatch::v1::DECISION_SOURCE_PROMQL_RULE, rule.name, target, rule.backend,
                         "PromQL " + rule.query + " = " + std::to_string(series.value) + " at " +
                             std::to_string(instant),
                         effective_step});
    } catch (const StoreError& e) {
      counters_.store_errors_total.Increment();
      state.fired.erase(key);
    }
  }
  // Series absent from this result re-arm.
  for (auto it = state.fired.begin(); it != state.fired.end();) {
    it = seen.count(*it) ? std::next(it) : state.fired.erase(it);
  }
  state.consecutive = std::move(seen);
}

}  // namespace gaugewatch::agent
