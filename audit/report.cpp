#include "audit/report.h"

#include <sstream>

#include "kernels/reference/metric_catalogue.h"

namespace gaugewatch::audit {

namespace {

// printf-free formatting: precision digits, significant (general) or after the point.
std::string number(double value, int precision = 4, std::ios::fmtflags style = std::ios::fmtflags{}) {
  std::ostringstream out;
  out.flags(style);
  out.precision(precision);
  out << value;
  return out.str();
}

std::string percent(double ratio) { return number(100.0 * ratio) + "%"; }

std::string pad(const std::string& text, size_t width) {
  return text.size() >= width ? text + " " : text + std::string(width - text.size(), ' ');
}

}  // namespace

std::string format_report(const AuditReport& r) {
  std::ostringstream out;
  const auto& s = r.shape;
  out << "== " << r.source << ": B=" << s.batch << " Hq=" << s.q_heads << " Hkv=" << s.kv_heads
      << " N=" << s.q_len << " M=" << s.kv_len << " d=" << s.head_dim
      << ", causal " << reference::to_string(r.causal) << ", scale " << number(r.scale);
  if (r.segments > 0) out << ", " << r.segments << " packed segments";
  out << "\n";
  const std::string coord = "dQ[:, " + std::to_string(r.offset_coordinate) + "]";
  out << pad("backend", 8) << pad("dQ err", 12) << pad("dK err", 12) << pad("dV err", 12)
      << pad(coord + " row 0", 18) << pad("max|err| " + coord, 22) << "time\n";
  for (const auto& b : r.backends) {
    out << pad(b.name, 8) << pad(percent(b.dq_error), 12) << pad(percent(b.dk_error), 12)
        << pad(percent(b.dv_error), 12) << pad(number(b.offset_coordinate_first_row, 6), 18)
        << pad(number(b.offset_coordinate_max_error, 3, std::ios::scientific), 22) << number(b.seconds, 2, std::ios::fixed) + "s" << "\n";
  }
  out << "errors are ||x - x_fp64|| / ||x_fp64||; bf16 is the plain fused BF16 backward, center the same on "
         "centred keys (kbar per key/value head, policy auto); FP64 row-sum check "
      << number(r.exact_max_relative_row_sum, 1, std::ios::scientific) << "\n";
  out << "metrics (docs/numerics.md; discrepancies against the FP32 recompute):\n";
  for (const auto& spec : reference::metric_catalogue()) {
    out << "  " << pad(std::string(spec.name), 32) << pad(number(r.metrics[spec.id], 6), 14)
        << spec.unit << "\n";
  }
  return out.str();
}

nlohmann::json report_to_json(const AuditReport& r) {
  nlohmann::json j;
  j["source"] = r.source;
  j["shape"] = {{"batch", r.shape.batch},     {"q_heads", r.shape.q_heads},
                {"kv_heads", r.shape.kv_heads}, {"q_len", r.shape.q_len},
                {"kv_len", r.shape.kv_len},     {"head_dim", r.shape.head_dim}};
  j["causal"] = std::string(reference::to_string(r.causal));
  j["scale"] = r.scale;
  j["segments"] = r.segments;
  j["offset_coordinate"] = r.offset_coordinate;
  j["exact_max_relative_row_sum"] = r.exact_max_relative_row_sum;
  j["backends"] = nlohmann::json::array();
  for (const auto& b : r.backends) {
    j["backends"].push_back({{"name", b.name},
                             {"dq_error", b.dq_error},
                             {"dk_error", b.dk_error},
                             {"dv_error", b.dv_error},
                             {"offset_coordinate_first_row", b.offset_coordinate_first_row},
                             {"offset_coordinate_max_error", b.offset_coordinate_max_error},
                             {"seconds", b.seconds}});
  }
  nlohmann::json metrics = nlohmann::json::object();
  for (const auto& spec : reference::metric_catalogue()) metrics[std::string(spec.name)] = r.metrics[spec.id];
  j["metrics"] = metrics;
  return j;
}

}  // namespace gaugewatch::audit
