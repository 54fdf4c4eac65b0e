#include "agent/export/status_page.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>

namespace gaugewatch::agent {

namespace {

constexpr int kSparkWidth = 160;
constexpr int kSparkHeight = 28;
constexpr double kLogFloor = -4.0;  // 1e-4: below every discrepancy worth seeing
constexpr double kLogCeil = 0.0;    // 1 = 100%

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:baseline}
header h1{font-size:18px;margin:0}
main{padding:12px 20px}
section{margin-bottom:18px}
h2{font-size:16px;margin:8px 0}
details.run{background:#fff;border:1px solid #d9dde3;border-radius:6px;margin:8px 0;padding:6px 10px}
details.run>summary{cursor:pointer;font-weight:600}
.rank{margin:8px 0 12px 8px}
.rank h3{font-size:14px;margin:6px 0;font-weight:600}
.rank h3 small{font-weight:400;color:#566}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eceef1;white-space:nowrap}
th{font-weight:600;color:#445;font-size:12px}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.backend{padding:1px 6px;border-radius:3px;background:#e8eaee}
.backend.correcting{background:#d8f0de;color:#14532d;font-weight:600}
.backend.pending{background:#fde8c8;color:#7c2d12}
.high{color:#b91c1c;font-weight:600}
.state{padding:1px 6px;border-radius:3px;font-size:12px}
.state.connected{background:#d8f0de}.state.finished{background:#dbe7fb}
.state.silent{background:#fbd5d5}.state.disconnected{background:#eceef1}
ul.warnings{margin:0;padding-left:18px}
li.warning{color:#7c2d12}
svg.sparkline polyline{fill:none;stroke:#2563eb;stroke-width:1.5}
svg.sparkline line{stroke:#dc2626;stroke-width:1;stroke-dasharray:3 2}
.empty{color:#778}
)";

bool correcting(std::string_view backend) {
  return backend == "gproj" || backend == "pivot" || backend == "center" || backend == "fp32";
}

std::string percent(double value) {
  char text[32];
  std::snprintf(text, sizeof text, value < 0.001 ? "%.3f%%" : "%.2f%%", value * 100.0);
  return text;
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", value);
  return text;
}

std::string utc_time(std::int64_t unix_ns) {
  const std::time_t seconds = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

double log_y(double value, int height) {
  const double v = std::clamp(std::log10(std::max(value, 1e-12)), kLogFloor, kLogCeil);
  return (kLogCeil - v) / (kLogCeil - kLogFloor) * (height - 2) + 1;
}

const char* state_name(StatusRank::State state) {
  switch (state) {
    case StatusRank::State::kConnected: return "connected";
    case StatusRank::State::kDisconnected: return "disconnected";
    case StatusRank::State::kFinished: return "finished";
    case StatusRank::State::kSilent: return "silent";
  }
  return "unknown";
}

void sparkline(std::ostringstream& out, const StatusLayer& layer, double threshold) {
  const std::string points = sparkline_points(layer.recent_live_dq, kSparkWidth, kSparkHeight);
  if (points.empty()) {
    out << "<span class=\"empty\">no samples</span>";
    return;
  }
  char threshold_y[16];
  std::snprintf(threshold_y, sizeof threshold_y, "%.1f", log_y(threshold, kSparkHeight));
  out << "<svg class=\"sparkline\" width=\"" << kSparkWidth << "\" height=\"" << kSparkHeight
      << "\" viewBox=\"0 0 " << kSparkWidth << ' ' << kSparkHeight << "\" data-points=\""
      << layer.recent_live_dq.size() << "\" role=\"img\" aria-label=\"recent live dQ discrepancy of "
      << html_escape(layer.name) << "\"><title>last " << layer.recent_live_dq.size()
      << " samples, log scale 0.01%..100%, dashed: switch threshold " << percent(threshold)
      << "</title><line x1=\"0\" x2=\"" << kSparkWidth << "\" y1=\"" << threshold_y << "\" y2=\""
      << threshold_y << "\"/><polyline points=\"" << points << "\"/></svg>";
}

void layer_row(std::ostringstream& out, const StatusLayer& layer, double threshold) {
  const bool switched = correcting(layer.backend);
  const bool pending = !layer.desired.empty() && layer.desired != layer.backend;
  out << "<tr class=\"layer" << (switched ? " switched" : "") << "\" data-layer=\"" << layer.index
      << "\" data-backend=\"" << html_escape(layer.backend) << "\"><td class=\"num\">" << layer.index
      << "</td><td>" << html_escape(layer.name) << "</td><td><span class=\"backend"
      << (switched ? " correcting" : "") << "\">" << html_escape(layer.backend) << "</span>";
  if (pending) {
    out << " &rarr; <span class=\"backend pending\" title=\"asked for, not yet acknowledged\">"
        << html_escape(layer.desired) << "</span>";
  }
  out << "</td><td class=\"num live-dq";
  if (layer.live_dq && *layer.live_dq > threshold) out << " high";
  out << "\">" << (layer.live_dq ? percent(*layer.live_dq) : "&ndash;") << "</td><td>";
  sparkline(out, layer, threshold);
  out << "</td><td class=\"num\">" << (layer.gproj_dq ? percent(*layer.gproj_dq) : "&ndash;")
      << "</td><td class=\"num\">" << (layer.offset_ratio ? number(*layer.offset_ratio) : "&ndash;")
      << "</td><td class=\"num\">" << layer.samples << "</td><td>"
      << (layer.monitored ? "yes" : "<span class=\"high\">no: " + html_escape(layer.unmonitored_reason) +
                                        "</span>")
      << "</td></tr>";
}

void rank_block(std::ostringstream& out, const StatusRank& rank, double threshold) {
  out << "<div class=\"rank\" data-rank=\"" << rank.rank << "\" data-state=\"" << state_name(rank.state)
      << "\"><h3>rank " << rank.rank << " <span class=\"state " << state_name(rank.state) << "\">"
      << state_name(rank.state) << "</span> <small>" << html_escape(rank.host) << ", local rank "
      << rank.local_rank;
  if (!rank.gpu_uuid.empty()) {
    out << ", " << html_escape(rank.gpu_uuid) << " (" << html_escape(rank.pci_bus_id) << ")";
  }
  out << "</small></h3><table class=\"layers\"><thead><tr><th>layer</th><th>module</th>"
         "<th>backend</th><th>live dQ</th><th>recent live dQ</th><th>GProj dQ</th>"
         "<th>offset/spread</th><th>samples</th><th>monitored</th></tr></thead><tbody>";
  for (const auto& layer : rank.layers) layer_row(out, layer, threshold);
  out << "</tbody></table></div>";
}

void run_block(std::ostringstream& out, const StatusRun& run, double threshold) {
  std::size_t layers = 0, switched = 0;
  std::optional<double> worst;
  for (const auto& rank : run.ranks) {
    for (const auto& layer : rank.layers) {
      ++layers;
      if (correcting(layer.backend)) ++switched;
      if (layer.live_dq) worst = std::max(worst.value_or(0.0), *layer.live_dq);
    }
  }
  out << "<details class=\"run\" open data-run=\"" << html_escape(run.run) << "\"><summary>run "
      << html_escape(run.run) << " &mdash; " << run.ranks.size()
      << (run.ranks.size() == 1 ? " rank, " : " ranks, ") << layers << " layers, <span class=\"switched-count\">"
      << switched << " switched</span>";
  if (worst) {
    out << ", worst live dQ <span class=\"" << (*worst > threshold ? "high" : "") << "\">"
        << percent(*worst) << "</span>";
  }
  out << "</summary>";
  for (const auto& rank : run.ranks) rank_block(out, rank, threshold);
  out << "</details>";
}

void warnings(std::ostringstream& out, const StatusView& view) {
  std::vector<std::string> items;
  for (const auto& run : view.runs) {
    for (const auto& rank : run.ranks) {
      const std::string where = "run " + html_escape(run.run) + " rank " + std::to_string(rank.rank);
      const std::string data = " data-run=\"" + html_escape(run.run) + "\" data-rank=\"" +
                               std::to_string(rank.rank) + "\"";
      for (const auto& calls : rank.unmonitored_calls) {
        if (calls.calls == 0) continue;
        const std::uint64_t total = rank.monitored_calls + calls.calls;
        items.push_back("<li class=\"warning coverage\"" + data + " data-reason=\"" +
                        html_escape(calls.reason) + "\">" + where + ": " + std::to_string(calls.calls) +
                        " of " + std::to_string(total) + " attention calls not monitored (" +
                        html_escape(calls.reason) + ")</li>");
      }
      for (const auto& layer : rank.layers) {
        if (layer.monitored) continue;
        items.push_back("<li class=\"warning coverage\"" + data + ">" + where + ": layer " +
                        html_escape(layer.name) + " not monitored (" +
                        html_escape(layer.unmonitored_reason) + ")</li>");
      }
      if (rank.state == StatusRank::State::kSilent) {
        items.push_back("<li class=\"warning silent\"" + data + ">" + where +
                        ": silent without a goodbye (hung, crashed or cut off)</li>");
      }
    }
  }
  out << "<section id=\"warnings\"><h2>Coverage and health warnings</h2>";
  if (items.empty()) {
    out << "<p class=\"empty\">none</p>";
  } else {
    out << "<ul class=\"warnings\">";
    for (const auto& item : items) out << item;
    out << "</ul>";
  }
  out << "</section>";
}

void decisions(std::ostringstream& out, const StatusView& view) {
  out << "<section id=\"decisions\"><h2>Recent switch decisions</h2>";
  if (view.decisions.empty()) {
    out << "<p class=\"empty\">none</p></section>";
    return;
  }
  out << "<table><thead><tr><th>time</th><th>run</th><th>rank</th><th>layers</th><th>backend</th>"
         "<th>source</th><th>reason</th></tr></thead><tbody>";
  for (const auto& d : view.decisions) {
    std::string layers;
    for (const auto layer : d.layers) layers += (layers.empty() ? "" : ",") + std::to_string(layer);
    out << "<tr class=\"decision\" data-run=\"" << html_escape(d.run) << "\"><td>"
        << utc_time(d.time_unix_ns) << "</td><td>" << (d.run.empty() ? "all runs" : html_escape(d.run))
        << "</td><td>" << (d.rank ? std::to_string(*d.rank) : "all") << "</td><td>"
        << (layers.empty() ? "all" : layers) << "</td><td><span class=\"backend"
        << (correcting(d.backend) ? " correcting" : "") << "\">" << html_escape(d.backend)
        << "</span></td><td>" << html_escape(d.source) << "</td><td>" << html_escape(d.reason)
        << "</td></tr>";
  }
  out << "</tbody></table></section>";
}

}  // namespace

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string sparkline_points(const std::vector<double>& values, int width, int height) {
  if (values.empty()) return "";
  std::string out;
  const double step = values.size() > 1 ? static_cast<double>(width - 2) / (values.size() - 1) : 0.0;
  char point[40];
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double x = values.size() > 1 ? 1 + step * i : width / 2.0;
    std::snprintf(point, sizeof point, "%s%.1f,%.1f", i ? " " : "", x, log_y(values[i], height));
    out += point;
  }
  return out;
}

std::string render_status_page(const StatusView& view) {
  std::size_t ranks = 0;
  for (const auto& run : view.runs) ranks += run.ranks.size();
  std::ostringstream out;
  out << "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
         "<meta http-equiv=\"refresh\" content=\""
      << kStatusPageRefreshSeconds << "\"><title>gaugewatch agent</title><style>" << kStyle
      << "</style></head><body><header><h1>gaugewatch agent</h1><span>version "
      << html_escape(view.agent_version) << "</span><span id=\"trainers\">" << view.trainers_connected
      << " trainers connected</span><span>" << view.runs.size() << " runs, " << ranks
      << " ranks</span><span>" << utc_time(view.now_unix_ns)
      << "</span></header><main>";
  warnings(out, view);
  out << "<section id=\"runs\"><h2>Runs</h2>";
  if (view.runs.empty()) out << "<p class=\"empty\">no trainer has connected</p>";
  for (const auto& run : view.runs) run_block(out, run, view.switch_threshold);
  out << "</section>";
  decisions(out, view);
  out << "</main></body></html>\n";
  return out.str();
}

}  // namespace gaugewatch::agent
