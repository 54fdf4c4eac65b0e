#include "cli/audit_command.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <stdexcept>

#include "audit/audit_run.h"
#include "audit/report.h"
#include "audit/scenarios.h"
#include "cli/replay_command.h"
#include "kernels/reference/fused_forward_bf16.h"

namespace gaugewatch::cli {

namespace {

constexpr const char* kUsage = R"(usage:
  gaugewatch audit <scenario> [options]     run the reference on a generated scenario
  gaugewatch audit all [options]            every scenario, then a summary
  gaugewatch audit --input FILE [options]   operands captured to a safetensors file
  gaugewatch audit --input FILE --device cpu|cuda [--repeat N] [--json]
                                            replay the captured call through every backward
                                            this machine has (SDPA flash, cuDNN, efficient,
                                            math; gaugewatch bf16, gproj, pivot, center, fp32):
                                            errors against FP64 and times (needs torch)
  gaugewatch audit --list                   list the scenarios

Prints, per backend (fp64, fp32, bf16 = plain fused BF16 emulation, gproj,
pivot, center), the dQ/dK/dV errors against FP64, dQ in the coordinate a common key
offset leaks into, and the per-call metrics (docs/numerics.md, "Metric
definitions").

options:
  --json                 print JSON instead of tables
  --seed N               random seed (default 1)
  --batch B --heads H --kv-heads H --q-len N --kv-len M --head-dim D
                         override the scenario's shape
  --causal MODE          none | top_left (SDPA is_causal) | bottom_right (FlashAttention)
  --scale X              softmax scale (default 1/sqrt(d))
  --key-offset RMS       common key offset, per-coordinate RMS
  --query-gain G         query scale (sharpness)
  --save-operands FILE   write the scenario's operands (q, k, v, out, lse, grad_out) as safetensors
  --dump-gradients FILE  write every backend's dQ, dK, dV as safetensors
  --threads N            CPU threads (default: all; also GAUGEWATCH_THREADS)
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string target;  // scenario name, "all", or empty with --input
  std::optional<std::string> input, save_operands, dump_gradients, device;
  std::optional<int64_t> repeat;
  bool json = false, list = false;
  audit::ScenarioSpec overrides;
  bool has_seed = false, has_causal = false, has_scale = false, has_key_offset = false,
       has_gain = false;
  std::optional<int64_t> batch, heads, kv_heads, q_len, kv_len, head_dim;
};

int64_t parse_int(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used != text.size() || value < 1) throw std::invalid_argument("");
    return value;
  } catch (const std::exception&) {
    throw UsageError(flag + " needs a positive integer, got '" + text + "'");
  }
}

double parse_double(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used != text.size()) throw std::invalid_argument("");
    return value;
  } catch (const std::exception&) {
    throw UsageError(flag + " needs a number, got '" + text + "'");
  }
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw UsageError(a + " needs a value");
      return args[++i];
    };
    if (a == "--json") o.json = true;
    else if (a == "--list") o.list = true;
    else if (a == "--input") o.input = value();
    else if (a == "--device") {
      o.device = value();
      if (*o.device != "cpu" && *o.device != "cuda") {
        throw UsageError("--device takes cpu or cuda, got '" + *o.device + "'");
      }
    }
    else if (a == "--repeat") o.repeat = parse_int(a, value());
    else if (a == "--save-operands") o.save_operands = value();
    else if (a == "--dump-gradients") o.dump_gradients = value();
    else if (a == "--seed") { o.overrides.seed = static_cast<uint64_t>(parse_int(a, value())); o.has_seed = true; }
    else if (a == "--batch") o.batch = parse_int(a, value());
    else if (a == "--heads") o.heads = parse_int(a, value());
    else if (a == "--kv-heads") o.kv_heads = parse_int(a, value());
    else if (a == "--q-len") o.q_len = parse_int(a, value());
    else if (a == "--kv-len") o.kv_len = parse_int(a, value());
    else if (a == "--head-dim") o.head_dim = parse_int(a, value());
    else if (a == "--causal") {
      try {
        o.overrides.causal = reference::parse_causal_mode(value());
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
      o.has_causal = true;
    }
    else if (a == "--scale") { o.overrides.scale = parse_double(a, value()); o.has_scale = true; }
    else if (a == "--key-offset") { o.overrides.key_offset_rms = parse_double(a, value()); o.has_key_offset = true; }
    else if (a == "--query-gain") { o.overrides.query_gain = parse_double(a, value()); o.has_gain = true; }
    else if (a == "--threads") setenv("GAUGEWATCH_THREADS", std::to_string(parse_int(a, value())).c_str(), 1);
    else if (a == "-h" || a == "--help") throw UsageError("");
    else if (!a.empty() && a[0] == '-') throw UsageError("unknown option " + a);
    else if (o.target.empty()) o.target = a;
    else throw UsageError("unexpected argument '" + a + "'");
  }
  if ((o.device || o.repeat) && !o.input) {
    throw UsageError("--device and --repeat replay a captured call: give --input FILE");
  }
  if (!o.list && o.target.empty() && !o.input) throw UsageError("name a scenario, 'all', or --input FILE");
  if (o.input && !o.target.empty()) throw UsageError("give either a scenario or --input, not both");
  return o;
}

audit::ScenarioSpec apply(const Options& o, audit::ScenarioSpec spec) {
  if (spec.kind == "witness") return spec;  // the witness is exact as defined
  if (o.has_seed) spec.seed = o.overrides.seed;
  if (o.has_causal) spec.causal = o.overrides.causal;
  if (o.has_scale) spec.scale = o.overrides.scale;
  if (o.has_key_offset) spec.key_offset_rms = o.overrides.key_offset_rms;
  if (o.has_gain) spec.query_gain = o.overrides.query_gain;
  auto& s = spec.shape;
  if (o.batch) s.batch = *o.batch;
  if (o.heads) s.q_heads = *o.heads;
  if (o.kv_heads) s.kv_heads = *o.kv_heads;
  else if (o.heads) s.kv_heads = *o.heads;
  if (o.q_len) s.q_len = *o.q_len;
  if (o.kv_len) s.kv_len = *o.kv_len;
  else if (o.q_len && spec.kind != "two_key") s.kv_len = *o.q_len;
  if (o.head_dim) s.head_dim = *o.head_dim;
  return spec;
}

audit::AuditOutcome audit_scenario(const Options& o, const audit::Scenario& scenario) {
  audit::CapturedOperands ops;
  ops.inputs = audit::make_inputs(apply(o, scenario.spec));
  ops.saved = reference::forward_fused_bf16(ops.inputs);
  if (o.save_operands) audit::save_operands(*o.save_operands, ops);
  return audit::run_audit(scenario.name, ops);
}

void print_summary(const std::vector<audit::AuditReport>& reports) {
  std::printf("\n== summary: dQ / dK error against FP64\n");
  std::printf("%-12s %-20s %-20s %-20s %-20s %s\n", "scenario", "bf16 (plain)", "gproj", "pivot", "center",
              "pivot/gproj dQ");
  for (const auto& r : reports) {
    const auto& gproj = r.backend("gproj");
    const auto& pivot = r.backend("pivot");
    std::printf("%-12s", r.source.c_str());
    for (const char* name : {"bf16", "gproj", "pivot", "center"}) {
      const auto& b = r.backend(name);
      char cell[48];
      std::snprintf(cell, sizeof cell, "%.3g%% / %.3g%%", 100 * b.dq_error, 100 * b.dk_error);
      std::printf(" %-20s", cell);
    }
    const double ratio = gproj.dq_error > 0 ? pivot.dq_error / gproj.dq_error : 0.0;
    std::printf(" %.2f\n", ratio);
  }
}

}  // namespace

int run_audit_command(const std::vector<std::string>& args) {
  Options o;
  try {
    o = parse(args);
  } catch (const UsageError& e) {
    if (std::string(e.what()).empty()) {
      std::cout << kUsage;
      return 0;
    }
    std::cerr << "gaugewatch audit: " << e.what() << "\n" << kUsage;
    return 2;
  }
  try {
    if (o.list) {
      for (const auto& s : audit::scenario_catalogue()) {
        std::printf("%-12s %s\n", s.name.c_str(), s.description.c_str());
      }
      return 0;
    }
    if (o.device) return run_replay({*o.input, *o.device, static_cast<long>(o.repeat.value_or(20)), o.json});
    std::vector<audit::AuditOutcome> outcomes;
    if (o.input) {
      outcomes.push_back(audit::run_audit(*o.input, audit::load_operands(*o.input)));
    } else if (o.target == "all") {
      if (o.save_operands || o.dump_gradients) {
        std::cerr << "gaugewatch audit: --save-operands and --dump-gradients take one scenario, not all\n";
        return 2;
      }
      for (const auto& s : audit::scenario_catalogue()) outcomes.push_back(audit_scenario(o, s));
    } else {
      const audit::Scenario* scenario = audit::find_scenario(o.target);
      if (!scenario) {
        std::cerr << "gaugewatch audit: no scenario '" << o.target
                  << "'; `gaugewatch audit --list` lists them\n";
        return 2;
      }
      outcomes.push_back(audit_scenario(o, *scenario));
    }
    if (o.dump_gradients) audit::write_gradients(*o.dump_gradients, outcomes.front());
    if (o.json) {
      nlohmann::json all = nlohmann::json::array();
      for (const auto& out : outcomes) all.push_back(audit::report_to_json(out.report));
      std::cout << (all.size() == 1 ? all[0] : all).dump(2) << "\n";
      return 0;
    }
    std::vector<audit::AuditReport> reports;
    for (const auto& out : outcomes) {
      std::cout << audit::format_report(out.report) << "\n";
      reports.push_back(out.report);
    }
    if (reports.size() > 1) print_summary(reports);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gaugewatch audit: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace gaugewatch::cli
