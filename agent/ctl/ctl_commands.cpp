#include "agent/ctl/ctl_commands.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "agent/common/backend_names.h"
#include "agent/common/cli_environment.h"
#include "agent/common/default_paths.h"
#include "agent/common/token_file.h"
#include "gaugewatch/v1/admin_service.grpc.pb.h"
#include "kernels/reference/metric_catalogue.h"

namespace gaugewatch::agent {

namespace {

namespace v1 = gaugewatch::v1;

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string command;  // the subcommand's name
  std::string socket = default_paths().socket;
  std::string address;
  std::string tls_ca;
  std::string token_file;
  std::string token;  // from token_file, else GAUGEWATCH_TOKEN
  bool json = false;
  double timeout_seconds = 10;
  std::string run;
  bool all_runs = false;
  std::optional<std::uint32_t> rank;
  std::vector<std::uint32_t> layers;
  std::string backend;
  std::string reason;
  std::uint32_t limit = 20;
  bool audit = false;
  std::uint32_t every = 0;
  double layer_fraction = 0;
  std::uint32_t max_heads = 0;
  std::uint32_t max_rows = 0;
  std::optional<std::uint32_t> layer;
  std::uint32_t layer_value = 0;  // --layer, when given
  std::uint32_t count = 1;
  std::uint32_t layer_offset = 0;
};

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw UsageError(std::string(what) + ": cannot read '" + path + "'");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

std::string fmt_time(std::int64_t unix_ns) {
  if (unix_ns == 0) return "-";
  const std::time_t seconds = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

std::string fmt_metric(const v1::LayerMetrics& metrics, const char* field_name) {
  const auto* field = v1::LayerMetrics::descriptor()->FindFieldByName(field_name);
  if (field == nullptr || !metrics.GetReflection()->HasField(metrics, field)) return "-";
  std::ostringstream out;
  out << std::setprecision(4) << metrics.GetReflection()->GetDouble(metrics, field);
  return out.str();
}

std::string target_text(const v1::Target& t) {
  std::string out = t.all_runs() ? "all runs" : "run " + t.run_id();
  if (t.has_rank()) out += " rank " + std::to_string(t.rank());
  if (t.layers().empty()) {
    out += " all layers";
  } else {
    out += " layers";
    for (int i = 0; i < t.layers_size(); ++i) out += (i ? "," : " ") + std::to_string(t.layers(i));
  }
  return out;
}

std::string to_json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

std::string_view source_name(v1::DecisionSource source) {
  switch (source) {
    case v1::DECISION_SOURCE_ADMIN: return "admin";
    case v1::DECISION_SOURCE_RULE: return "rule";
    case v1::DECISION_SOURCE_PROMQL_RULE: return "promql";
    default: return "?";
  }
}

std::string_view audit_name(v1::AuditKind kind) {
  switch (kind) {
    case v1::AUDIT_KIND_RULE_FIRED: return "rule_fired";
    case v1::AUDIT_KIND_COMMAND_SENT: return "command_sent";
    case v1::AUDIT_KIND_COMMAND_ACKED: return "command_acked";
    case v1::AUDIT_KIND_COMMAND_REJECTED: return "command_rejected";
    case v1::AUDIT_KIND_ADMIN: return "admin";
    default: return "?";
  }
}

class Client {
 public:
  explicit Client(const Options& o) : options_(o) {
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    if (!o.address.empty()) {
      grpc::SslCredentialsOptions ssl;
      if (!o.tls_ca.empty()) ssl.pem_root_certs = read_file(o.tls_ca, "--tls-ca");
      credentials = grpc::SslCredentials(ssl);
      target_ = o.address;
    } else {
      credentials = grpc::InsecureChannelCredentials();
      target_ = "unix:" + o.socket;
    }
    stub_ = v1::AdminService::NewStub(grpc::CreateChannel(target_, credentials));
  }

  void prepare(grpc::ClientContext& context) const {
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<long>(options_.timeout_seconds * 1000)));
    if (!options_.token.empty()) context.AddMetadata("authorization", "Bearer " + options_.token);
  }

  void check(const grpc::Status& status) const {
    if (status.ok()) return;
    std::string hint;
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      hint = " (is gaugewatch-agent running and is the socket readable by you? see --socket/--address)";
    } else if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      hint = " (pass --token-file or GAUGEWATCH_TOKEN)";
    } else if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      hint = " (no answer within --timeout)";
    }
    throw std::runtime_error("agent at " + target_ + ": " + status.error_message() + hint);
  }

  v1::AdminService::Stub& stub() { return *stub_; }

 private:
  const Options& options_;
  std::string target_;
  std::unique_ptr<v1::AdminService::Stub> stub_;
};

int cmd_status(Client& client, const Options& o, std::ostream& out) {
  grpc::ClientContext context;
  client.prepare(context);
  v1::GetStatusResponse response;
  client.check(client.stub().GetStatus(&context, {}, &response));
  if (o.json) {
    out << to_json(response) << "\n";
    return kCtlOk;
  }
  out << "agent version     " << response.agent_version() << "\n"
      << "started           " << fmt_time(response.start_unix_time_ns()) << "\n"
      << "runs              " << response.runs() << "\n"
      << "ranks connected   " << response.ranks_connected() << "\n"
      << "ranks expired     " << response.ranks_expired() << "\n"
      << "samples received  " << response.samples_received_total() << "\n"
      << "samples rejected  " << response.samples_rejected_total() << "\n"
      << "samples shed      " << response.samples_shed_total() << " (rate limit)\n"
      << "decisions         " << response.decisions_total() << "\n"
      << "rules             " << response.rules() << "\n"
      << "grpc              " << response.grpc_listen() << "\n"
      << "http              " << response.http_listen() << "\n"
      << "database          " << response.database() << "\n";
  return kCtlOk;
}

int cmd_layers(Client& client, const Options& o, std::ostream& out) {
  grpc::ClientContext context;
  client.prepare(context);
  v1::ListRunsRequest request;
  request.set_run_id(o.run);
  request.set_include_layers(true);
  request.set_layer_offset(o.layer_offset);
  v1::ListRunsResponse response;
  client.check(client.stub().ListRuns(&context, request, &response));
  if (o.json) {
    out << to_json(response) << "\n";
    return kCtlOk;
  }
  const auto& dq = reference::metric_spec(reference::MetricId::kLiveDqDiscrepancy).name;
  const auto& gv = reference::metric_spec(reference::MetricId::kLiveGaugeViolation).name;
  const auto& ratio = reference::metric_spec(reference::MetricId::kKeyOffsetSpreadRatioMax).name;
  out << std::left << std::setw(20) << "RUN" << std::setw(6) << "RANK" << std::setw(8) << "STATE"
      << std::setw(7) << "LAYER" << std::setw(24) << "NAME" << std::setw(8) << "BACKEND"
      << std::setw(8) << "DESIRED" << std::setw(10) << "STEP" << std::setw(12) << "DQ_DISCR"
      << std::setw(12) << "GAUGE_VIOL" << std::setw(15) << "OFFSET/SPREAD" << "MONITORED\n";
  std::vector<std::string> notes;
  std::size_t rows = 0;
  for (const auto& run : response.runs()) {
    for (const auto& rank : run.ranks()) {
      const char* state = rank.finished() && !rank.connected() ? "finished"
                          : rank.expired()                      ? "expired"
                          : rank.connected()                    ? "live"
                                                                : "gone";
      if (rank.layer_count() > static_cast<std::uint32_t>(rank.layers_size()) && rank.layers_size() > 0) {
        const auto first = rank.layers(0).index();
        notes.push_back("run " + run.run_id() + " rank " + std::to_string(rank.rank()) + ": layers " +
                        std::to_string(first) + ".." + std::to_string(first + rank.layers_size() - 1) +
                        " of " + std::to_string(rank.layer_count()) + " shown (--layer-offset " +
                        std::to_string(first + rank.layers_size()) + " for more)");
      }
      for (const auto& layer : rank.layers()) {
        ++rows;
        out << std::left << std::setw(20) << run.run_id() << std::setw(6) << rank.rank()
            << std::setw(8) << state << std::setw(7) << layer.index() << std::setw(24)
            << layer.name().substr(0, 23) << std::setw(8) << backend_name(layer.backend())
            << std::setw(8)
            << (layer.desired_backend() == v1::BACKEND_UNSPECIFIED
                    ? std::string_view("-")
                    : backend_name(layer.desired_backend()))
            << std::setw(10) << layer.last_step() << std::setw(12)
            << fmt_metric(layer.latest(), std::string(dq).c_str()) << std::setw(12)
            << fmt_metric(layer.latest(), std::string(gv).c_str())
            << std::setw(15) << fmt_metric(layer.latest(), std::string(ratio).c_str())
            << (layer.monitored() ? std::string("yes")
                                  : "no: " + (layer.unmonitored_reason().empty() ? std::string("unknown")
                                                                                 : layer.unmonitored_reason()))
            << "\n";
      }
    }
  }
  if (rows == 0) out << "(no layers" << (o.run.empty() ? "" : " for run " + o.run) << ")\n";
  for (const auto& note : notes) out << note << "\n";
  return kCtlOk;
}

int cmd_switch(Client& client, const Options& o, std::ostream& out) {
  if (o.all_runs == !o.run.empty()) throw UsageError("switch needs exactly one of --run and --all-runs");
  auto backend = parse_backend(o.backend);
  if (!backend) throw UsageError("switch needs --backend stock|gproj|pivot|fp32, got '" + o.backend + "'");
  v1::SetBackendRequest request;
  request.mutable_target()->set_run_id(o.run);
  request.mutable_target()->set_all_runs(o.all_runs);
  if (o.rank) request.mutable_target()->set_rank(*o.rank);
  for (auto layer : o.layers) request.mutable_target()->add_layers(layer);
  request.set_backend(*backend);
  request.set_reason(o.reason);
  grpc::ClientContext context;
  client.prepare(context);
  v1::SetBackendResponse response;
  client.check(client.stub().SetBackend(&context, request, &response));
  if (o.json) {
    out << to_json(response) << "\n";
  } else {
    out << "decision " << response.decision_id() << ": " << target_text(request.target()) << " -> "
        << o.backend << "; sent to " << response.commands_sent() << " connected trainer(s)\n";
  }
  return kCtlOk;
}

v1::Target command_target(const Options& o, const char* command) {
  if (o.all_runs == !o.run.empty()) {
    throw UsageError(std::string(command) + " needs exactly one of --run and --all-runs");
  }
  v1::Target target;
  target.set_run_id(o.run);
  target.set_all_runs(o.all_runs);
  if (o.rank) target.set_rank(*o.rank);
  return target;
}

int cmd_sampling(Client& client, const Options& o, std::ostream& out) {
  v1::SetSamplingRequest request;
  *request.mutable_target() = command_target(o, "sampling");
  auto* p = request.mutable_sampling();
  p->set_every_n_steps(o.every);
  p->set_layer_fraction(o.layer_fraction);
  p->set_max_heads(o.max_heads);
  p->set_max_rows(o.max_rows);
  if (o.every == 0 && o.layer_fraction == 0 && o.max_heads == 0 && o.max_rows == 0) {
    throw UsageError("sampling needs at least one of --every, --layer-fraction, --max-heads, --max-rows");
  }
  grpc::ClientContext context;
  client.prepare(context);
  v1::CommandResponse response;
  client.check(client.stub().SetSampling(&context, request, &response));
  if (o.json) {
    out << to_json(response) << "\n";
  } else {
    out << "sampling sent to " << response.commands_sent() << " connected trainer(s)\n";
  }
  return kCtlOk;
}

int cmd_capture(Client& client, const Options& o, std::ostream& out) {
  v1::CaptureOperandsRequest request;
  *request.mutable_target() = command_target(o, "capture");
  if (!o.layer) throw UsageError("capture needs --layer");
  request.mutable_target()->add_layers(*o.layer);
  request.set_count(o.count);
  grpc::ClientContext context;
  client.prepare(context);
  v1::CommandResponse response;
  client.check(client.stub().CaptureOperands(&context, request, &response));
  if (o.json) {
    out << to_json(response) << "\n";
  } else {
    out << "capture of layer " << *o.layer << " sent to " << response.commands_sent()
        << " connected trainer(s)\n";
  }
  return kCtlOk;
}

int cmd_history(Client& client, const Options& o, std::ostream& out) {
  v1::ListDecisionsRequest request;
  request.set_run_id(o.run);
  request.set_limit(o.limit);
  request.set_include_audit(o.audit);
  grpc::ClientContext context;
  client.prepare(context);
  v1::ListDecisionsResponse response;
  client.check(client.stub().ListDecisions(&context, request, &response));
  if (o.json) {
    out << to_json(response) << "\n";
    return kCtlOk;
  }
  out << std::left << std::setw(6) << "ID" << std::setw(22) << "TIME" << std::setw(8) << "SOURCE"
      << std::setw(8) << "BACKEND" << std::setw(34) << "TARGET" << "RULE / REASON\n";
  for (const auto& d : response.decisions()) {
    out << std::left << std::setw(6) << d.decision_id() << std::setw(22) << fmt_time(d.unix_time_ns())
        << std::setw(8) << source_name(d.source()) << std::setw(8) << backend_name(d.backend())
        << std::setw(34) << target_text(d.target()) << d.rule() << ": " << d.reason() << "\n";
  }
  if (response.decisions().empty()) out << "(no decisions)\n";
  if (o.audit) {
    out << "\n" << std::left << std::setw(6) << "ID" << std::setw(22) << "TIME" << std::setw(18)
        << "KIND" << std::setw(20) << "RUN" << std::setw(6) << "RANK" << std::setw(9) << "COMMAND"
        << "DETAIL\n";
    for (const auto& a : response.audit()) {
      out << std::left << std::setw(6) << a.audit_id() << std::setw(22) << fmt_time(a.unix_time_ns())
          << std::setw(18) << audit_name(a.kind()) << std::setw(20) << a.run_id() << std::setw(6)
          << (a.has_rank() ? std::to_string(a.rank()) : "-") << std::setw(9) << a.command_id()
          << a.detail() << "\n";
    }
  }
  return kCtlOk;
}


// The command line (CLI11): connection and output flags on the program, each
// with its GAUGEWATCH_* variable; one subcommand per verb with its own flags
// and --help. A verb's target flags (--run, --layers, ...) have no variable:
// a stray variable must never retarget a switch.
class CtlCommandLine {
 public:
  CtlCommandLine() : app_("gaugewatchctl: operator CLI for gaugewatch-agent (its AdminService).", "gaugewatchctl") {
    app_.set_version_flag("--version", "gaugewatchctl " + std::string(kAgentVersion), "print the version and exit");
    app_.set_help_flag("-h,--help", "print this text (or a command's, after it) and exit");
    app_.require_subcommand(1);
    app_.fallthrough();  // connection flags may follow the command too
    app_.footer(
        "Exit status: 0 success, 1 the agent answered with an error or is unreachable,\n"
        "2 usage error. gaugewatchctl COMMAND --help lists a command's flags.");
    app_.get_formatter()->column_width(30);
    environment_.bind(app_.add_option("--socket", o_.socket,
                                      "unix socket of the agent (default: root /run/gaugewatch/agent.sock, "
                                      "others $XDG_RUNTIME_DIR/gaugewatch/agent.sock)")
                          ->type_name("PATH"),
                      "GAUGEWATCH_SOCKET");
    environment_.bind(app_.add_option("--address", o_.address, "host:port: TCP with TLS instead of the socket")
                          ->type_name("HOST:PORT"),
                      "GAUGEWATCH_ADDRESS");
    environment_.bind(app_.add_option("--tls-ca", o_.tls_ca, "CA certificate (PEM) that signed the agent's, for --address")
                          ->type_name("FILE")
                          ->check(existing_file()),
                      "GAUGEWATCH_TLS_CA");
    environment_.bind(app_.add_option("--token-file", o_.token_file,
                                      "file holding the bearer token for --address (GAUGEWATCH_TOKEN may hold "
                                      "the token itself)")
                          ->type_name("FILE")
                          ->check(existing_file()),
                      "GAUGEWATCH_TOKEN_FILE");
    environment_.bind(app_.add_option("--timeout", o_.timeout_seconds, "seconds per call (default 10)")
                          ->type_name("SECONDS")
                          ->check(CLI::Range(0.001, 86400.0)),
                      "GAUGEWATCH_TIMEOUT");
    environment_.bind(app_.add_flag("--json", o_.json, "JSON instead of tables"), "GAUGEWATCH_JSON");

    add_command("status", "agent version, counts, endpoints");
    auto* layers = add_command("layers",
                               "runs > ranks > layers (256 per rank from --layer-offset), latest metrics, "
                               "whether monitored and why not");
    layers->add_option("--run", o_.run, "only this run")->type_name("RUN");
    layers->add_option("--layer-offset", o_.layer_offset, "first layer shown of each rank")->type_name("N");

    auto* sw = add_command("switch", "set the attention backend of a run, rank or layers");
    add_target(sw);
    sw->add_option("--layers", o_.layers, "only these layers (default: all)")
        ->type_name("L,L,...")
        ->delimiter(',');
    // Checked by the command (cmd_switch), whose message names the choices.
    sw->add_option("--backend", o_.backend, "the backend (required)")->type_name("stock|gproj|pivot|fp32");
    sw->add_option("--reason", o_.reason, "why (kept with the decision)")->type_name("TEXT");

    auto* history = add_command("history", "switch decisions, newest first (and the audit log)");
    history->add_option("--run", o_.run, "only this run")->type_name("RUN");
    history->add_option("--limit", o_.limit, "most decisions shown (default 20)")
        ->type_name("N")
        ->check(CLI::Range(1u, 100000u));
    history->add_flag("--audit", o_.audit, "also the audit log");

    auto* sampling = add_command("sampling", "change connected trainers' sampling");
    add_target(sampling);
    sampling->add_option("--every", o_.every, "sample every N steps")->type_name("N")->check(CLI::Range(1u, 1000000u));
    sampling->add_option("--layer-fraction", o_.layer_fraction, "fraction of layers sampled per step")
        ->type_name("F")
        ->check(CLI::Validator(
            [](const std::string& text) -> std::string {
              const double value = std::strtod(text.c_str(), nullptr);
              return value > 0.0 && value <= 1.0 ? std::string() : "expected a number in (0, 1], got '" + text + "'";
            },
            "(0,1]"));
    sampling->add_option("--max-heads", o_.max_heads, "most heads audited per layer")->type_name("N");
    sampling->add_option("--max-rows", o_.max_rows, "most rows audited per head")->type_name("N");

    auto* capture = add_command("capture", "capture a layer's operands (the trainer writes them to disk)");
    add_target(capture);
    layer_option_ = capture->add_option("--layer", o_.layer_value, "the layer")->type_name("L")->required();
    capture->add_option("--count", o_.count, "captures (default 1)")->type_name("N")->check(CLI::Range(1u, 1000u));

    add_command("help", "this text");
  }

  // Parses the flags, then the environment. Throws CLI::ParseError (help and
  // version included: CtlCommandLine::exit prints those).
  const Options& parse(const std::vector<std::string>& args, const Environment& env) {
    app_.parse(std::vector<std::string>(args.rbegin(), args.rend()));
    environment_.apply(env);
    for (const CLI::App* command : app_.get_subcommands()) o_.command = command->get_name();
    for (const CLI::Option* rank : rank_options_) {
      if (rank->count() > 0) o_.rank = rank_value_;
    }
    if (layer_option_->count() > 0) o_.layer = o_.layer_value;
    if (!o_.token_file.empty()) {
      o_.token = read_file(o_.token_file, "--token-file");
    } else if (const char* token = env("GAUGEWATCH_TOKEN")) {
      o_.token = token;
    }
    if (!o_.token.empty()) {
      try {
        o_.token = token_from_file_contents(o_.token, o_.token_file.empty() ? "GAUGEWATCH_TOKEN" : "--token-file");
      } catch (const std::invalid_argument& e) {
        throw UsageError(e.what());
      }
    }
    return o_;
  }

  std::string help() {
    environment_.describe();
    return app_.help();
  }

  // Prints --help / --version to `out`, a parse error to `err`; returns the exit code.
  int exit(const CLI::ParseError& e, std::ostream& out, std::ostream& err) {
    if (dynamic_cast<const CLI::CallForHelp*>(&e) != nullptr) {
      out << help();
      return kCtlOk;
    }
    if (dynamic_cast<const CLI::CallForVersion*>(&e) != nullptr) {
      out << e.what() << "\n";
      return kCtlOk;
    }
    std::string message = e.what();
    if (app_.get_subcommands().empty() && !app_.remaining().empty()) {
      message = "unknown command '" + app_.remaining().front() +
                "' (status, layers, switch, history, sampling, capture, help)";
    }
    err << "gaugewatchctl: " << message << "\n(see gaugewatchctl --help)\n";
    return kCtlUsage;
  }

 private:
  CLI::App* add_command(const std::string& name, const std::string& description) {
    CLI::App* command = app_.add_subcommand(name, description);
    command->set_help_flag("-h,--help", "print this command's flags and exit");
    return command;
  }

  // --run / --all-runs / --rank: whom a command goes to.
  void add_target(CLI::App* command) {
    auto* run = command->add_option("--run", o_.run, "this run (or --all-runs)")->type_name("RUN");
    command->add_flag("--all-runs", o_.all_runs, "every run (or --run)")->excludes(run);
    rank_options_.push_back(
        command->add_option("--rank", rank_value_, "only this rank (default: all)")->type_name("N"));
  }

  CLI::App app_;
  EnvironmentFallback environment_;
  Options o_;
  std::uint32_t rank_value_ = 0;
  std::vector<CLI::Option*> rank_options_;
  CLI::Option* layer_option_ = nullptr;
};

}  // namespace

std::string ctl_help() { return CtlCommandLine().help(); }

int run_ctl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
            const std::function<const char*(const char*)>& env) {
  CtlCommandLine command_line;
  try {
    Options options;
    try {
      options = command_line.parse(args, env);
    } catch (const CLI::ParseError& e) {
      return command_line.exit(e, out, err);
    }
    if (options.command == "help") {
      out << ctl_help();
      return kCtlOk;
    }
    Client client(options);
    if (options.command == "status") return cmd_status(client, options, out);
    if (options.command == "layers") return cmd_layers(client, options, out);
    if (options.command == "switch") return cmd_switch(client, options, out);
    if (options.command == "history") return cmd_history(client, options, out);
    if (options.command == "sampling") return cmd_sampling(client, options, out);
    if (options.command == "capture") return cmd_capture(client, options, out);
    throw UsageError("unknown command '" + options.command + "'");
  } catch (const UsageError& e) {
    err << "gaugewatchctl: " << e.what() << "\n(see gaugewatchctl --help)\n";
    return kCtlUsage;
  } catch (const std::exception& e) {
    err << "gaugewatchctl: " << e.what() << "\n";
    return kCtlRpcError;
  }
}

}  // namespace gaugewatch::agent
