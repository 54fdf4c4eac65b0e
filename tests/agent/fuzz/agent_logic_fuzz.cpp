// libFuzzer target over the agent's logic behind its parsers (agent_fuzz
// covers the parsers). The first byte picks the part (logic_fuzz_input.h):
//
//  - controller: up to four trainer streams send Hello, SampleBatch, acks and
//    Goodbye to a real Controller with a real SQLite store (in memory) and
//    the shipped example configuration's rules; operators switch backends and
//    query; silent ranks expire. Then /metrics is rendered from the state and
//    checked: parseable text format, no NaN or infinity, counters >= 0, and
//    no more per-layer and per-rank series than the cardinality guard allows.
//  - http: raw bytes to the agent's HTTP port (a real Agent on loopback, with
//    a trainer's state in it): the answer is HTTP, HEAD has no body, /metrics
//    parses, /healthz says ok, and the server keeps answering.
//
// Mutations keep the record framing (logic_fuzz_mutator.cpp).
//
// Build: -DGAUGEWATCH_ENABLE_FUZZ=ON with clang. Run: agent_logic_fuzz
// CORPUS_DIR tests/agent/fuzz/logic_corpus (CTest: agent_logic_fuzz_bounded).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "agent/common/backend_names.h"
#include "agent/common/event_log.h"
#include "agent/common/label_safe.h"
#include "agent/config/agent_config.h"
#include "agent/config/config_options.h"
#include "agent/export/exposition.h"
#include "agent/export/http_server.h"
#include "agent/export/state_collector.h"
#include "agent/server/agent.h"
#include "agent/server/controller.h"
#include "agent/server/message_validator.h"
#include "agent/store/decision_store.h"
#include "gaugewatch/v1/admin_service.pb.h"
#include "gaugewatch/v1/hook_service.pb.h"
#include "tests/agent/fuzz/exposition_check.h"
#include "tests/agent/fuzz/logic_fuzz_input.h"

namespace {

using namespace gaugewatch::agent;
using namespace gaugewatch::agent::fuzz;
namespace v1 = gaugewatch::v1;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "agent_logic_fuzz: invariant broken: %s\n", what.c_str());
  std::abort();
}

// The shipped example configuration (its rules: run-scope switch, capture),
// with limits small enough that inputs reach them. Read once (yaml-cpp
// would otherwise be the largest cost of an input).
AgentConfig fuzz_config(const std::string& database) {
  static const AgentConfig example = [] {
    AgentConfig parsed;
    apply_yaml(read_text_file(GAUGEWATCH_EXAMPLE_CONFIG, "example configuration"), parsed);
    return parsed;
  }();
  AgentConfig config = example;
  config.database = database;
  config.max_series = 300;
  config.trainer_sample_rate = 0;  // unlimited: what happens does not depend on the clock
  config.rank_expiry_seconds = 1e-6;  // the expire action expires every silent rank
  config.limits.max_layers = 16;
  config.limits.max_batch_samples = 32;
  config.limits.max_ranks = 6;
  return config;
}

// The text of /metrics as the agent renders it; checked, and the series the
// state collector adds counted against the guard.
void check_metrics(const AgentCounters& counters, const StateCollector& collector, const RunRegistry& registry) {
  const std::string text = render_metrics({&counters.registry()}, collector);
  if (const std::string why = check_exposition(text); !why.empty()) fail("/metrics: " + why);
  // The collector renders per-layer series (as text) and per-rank series plus
  // four gauges of its own (series, limit, refused, ranks retained).
  const std::string state = render_metrics({}, collector);
  std::uint64_t samples = 0;
  for (std::size_t i = 0; i < state.size(); ++i) {
    if ((i == 0 || state[i - 1] == '\n') && state[i] != '#') ++samples;
  }
  if (samples < 4 || samples - 4 > registry.max_series()) {
    fail("/metrics holds " + std::to_string(samples - 4) + " per-layer/rank series; max_series is " +
         std::to_string(registry.max_series()));
  }
  if (registry.exported_series() > registry.max_series()) fail("exported_series above max_series");
}

// The admin service's checks of a switch (agent/server/admin_service.cpp) for
// the operator's path into Controller::decide.
bool admissible(const v1::SetBackendRequest& request, Controller& controller) {
  const auto& target = request.target();
  const auto& limits = controller.config().limits;
  if (!parse_backend(backend_name(request.backend()))) return false;
  if (target.all_runs() == !target.run_id().empty()) return false;
  if (!target.all_runs() && !is_label_safe(target.run_id(), limits.max_run_id_bytes)) return false;
  if (static_cast<std::uint32_t>(target.layers_size()) > limits.max_layers) return false;
  for (auto layer : target.layers()) {
    if (layer >= limits.max_layers) return false;
  }
  if (target.all_runs()) return true;
  v1::ListRunsRequest known;
  known.set_run_id(target.run_id());
  v1::ListRunsResponse runs;
  controller.list_runs(known, runs);
  return runs.runs_size() > 0;
}

// The connection counts agree with the streams: at most one rank per open
// stream is connected, and none once every stream has ended.
void check_connections(Controller& controller, unsigned open_streams) {
  v1::GetStatusResponse status;
  controller.status(status);
  const double trainers = controller.counters().trainers_connected.Value();
  if (status.ranks_connected() > open_streams || trainers < 0 || trainers > open_streams) {
    fail(std::to_string(status.ranks_connected()) + " ranks and " + std::to_string(trainers) +
         " trainers connected over " + std::to_string(open_streams) + " open streams");
  }
}

void fuzz_controller(const std::uint8_t* data, std::size_t size) {
  DecisionStore store(":memory:");
  AgentCounters counters;
  Controller controller(fuzz_config(":memory:"), store, counters);
  StateCollector collector(controller.registry());
  std::shared_ptr<Session> streams[kStreams];
  for (auto& stream : streams) stream = controller.open_session();
  const auto reconnect = [&](unsigned slot) {
    controller.close_session(*streams[slot]);
    streams[slot] = controller.open_session();
  };

  RecordReader reader(data, size);
  Record record;
  v1::TrainerMessage message;
  int records = 0;
  while (reader.next(record) && ++records <= 64) {
    const unsigned slot = record.stream;
    switch (record.action) {
      case Action::kMessage: {
        // As the transport does (agent/server/hook_service.cpp): bytes that
        // are no TrainerMessage, or a refused message, end the stream.
        Verdict verdict;
        if (!message.ParseFromArray(record.body.data(), static_cast<int>(record.body.size()))) {
          verdict = controller.reject_transport(RejectReason::kUnparseable, "fuzz");
        } else {
          verdict = controller.handle(streams[slot], message);
        }
        if (!verdict.ok()) reconnect(slot);
        break;
      }
      case Action::kAck: {
        v1::CommandAck ack;
        if (!ack.ParseFromArray(record.body.data(), static_cast<int>(record.body.size()))) break;
        {
          // Pick one of the commands the stream holds (or, one past them, an
          // id never sent).
          Session& session = *streams[slot];
          std::lock_guard lock(session.pending_mu);
          std::size_t pick = ack.command_id() % (session.pending.size() + 1);
          for (const auto& [id, command] : session.pending) {
            if (pick-- == 0) {
              ack.set_command_id(id);
              break;
            }
          }
        }
        v1::TrainerMessage wrapped;
        *wrapped.mutable_ack() = ack;
        if (!controller.handle(streams[slot], wrapped).ok()) reconnect(slot);
        break;
      }
      case Action::kReconnect:
        reconnect(slot);
        break;
      case Action::kExpire:
        controller.expire_ranks();
        break;
      case Action::kQuery: {
        v1::ListRunsRequest request;
        if (!request.ParseFromArray(record.body.data(), static_cast<int>(record.body.size()))) break;
        v1::ListRunsResponse runs;
        controller.list_runs(request, runs);
        v1::GetStatusResponse status;
        controller.status(status);
        v1::ListDecisionsRequest decisions_request;
        decisions_request.set_run_id(request.run_id());
        decisions_request.set_limit(request.layer_offset() % 64);
        decisions_request.set_include_audit(request.include_layers());
        v1::ListDecisionsResponse decisions;
        controller.list_decisions(decisions_request, decisions);
        check_metrics(counters, collector, controller.registry());
        check_connections(controller, kStreams);
        break;
      }
      case Action::kDecide: {
        v1::SetBackendRequest request;
        if (!request.ParseFromArray(record.body.data(), static_cast<int>(record.body.size()))) break;
        if (!admissible(request, controller)) break;
        controller.decide(v1::DECISION_SOURCE_ADMIN, "admin fuzz", request.target(), request.backend(),
                          request.reason().empty() ? "set by operator" : request.reason());
        break;
      }
      case Action::kCount:
        break;
    }
  }
  check_metrics(counters, collector, controller.registry());
  check_connections(controller, kStreams);
  for (auto& stream : streams) controller.close_session(*stream);
  check_metrics(counters, collector, controller.registry());
  check_connections(controller, 0);
}

// --- http ------------------------------------------------------------------

class HttpFixture {
 public:
  HttpFixture() {
    char pattern[] = "/tmp/gw-fuzz-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) fail("mkdtemp");
    dir_ = pattern;
    AgentConfig config = fuzz_config(dir_ + "/agent.db");
    config.grpc_socket = dir_ + "/agent.sock";
    config.http_listen = "127.0.0.1:0";
    config.rank_expiry_seconds = 3600;
    agent_ = std::make_unique<Agent>(config);
    // One trainer's state, so that /metrics and the status page have layers.
    auto session = agent_->controller().open_session();
    v1::TrainerMessage hello;
    auto* h = hello.mutable_hello();
    h->set_protocol_version(v1::PROTOCOL_VERSION_1);
    h->set_run_id("fuzz-run");
    h->set_world_size(1);
    h->set_host("fuzz-host");
    for (std::uint32_t i = 0; i < 3; ++i) {
      auto* layer = h->add_layers();
      layer->set_index(i);
      layer->set_name("layers." + std::to_string(i) + ".attn");
      layer->set_backend(v1::BACKEND_STOCK);
    }
    if (!agent_->controller().handle(session, hello).ok()) fail("fixture Hello refused");
    v1::TrainerMessage batch;
    auto* sample = batch.mutable_samples()->add_samples();
    sample->set_step(10);
    sample->set_layer(1);
    sample->set_backend(v1::BACKEND_STOCK);
    sample->mutable_metrics()->set_live_dq_discrepancy(0.02);
    sample->mutable_metrics()->set_key_rms(3.5);
    if (!agent_->controller().handle(session, batch).ok()) fail("fixture batch refused");
    session_ = session;
  }
  std::uint16_t port() const { return agent_->http_port(); }

 private:
  std::string dir_;
  std::unique_ptr<Agent> agent_;
  std::shared_ptr<Session> session_;
};

// A socket connected to the server on the loopback, with 15 s send and
// receive timeouts. ECONNREFUSED (nothing listens) fails at once; any other
// connect error is the client's side (no ephemeral port free, an
// interrupted or timed-out handshake on a loaded runner) and is tried twice
// more, 200 ms apart, before it fails too; every failure names its errno.
int connect_to(std::uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string errors;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) ::usleep(200 * 1000);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail(std::string("socket: ") + std::strerror(errno));
    timeval timeout{15, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    const int error = errno;
    ::close(fd);
    errors += std::string(errors.empty() ? "" : ", ") + std::strerror(error);
    if (error == ECONNREFUSED) break;
  }
  fail("the HTTP server refuses connections on port " + std::to_string(port) + ": " + errors);
}

// Sends `request`, half-closes, reads the answer until the server closes.
std::string exchange(std::uint16_t port, std::string_view request) {
  const int fd = connect_to(port);
  std::size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close early on garbage
    sent += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  std::string answer;
  char buffer[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      ::close(fd);
      fail("the HTTP server neither answered nor closed within 15 s");
    }
    if (n <= 0) break;
    answer.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return answer;
}

// The first response of `answer`: status, headers, and what follows them.
struct Response {
  int status = 0;
  long long content_length = -1;
  std::string_view rest;  // the bytes after the header block
};

// Every answer of the agent's server starts "HTTP/1.1 NNN " (its own status
// line, also for civetweb's errors: agent/export/http_server.cpp).
bool first_response(std::string_view answer, Response& out) {
  const std::size_t header_end = answer.find("\r\n\r\n");
  if (answer.rfind("HTTP/1.1 ", 0) != 0 || header_end == std::string_view::npos || answer.size() < 13 ||
      answer[12] != ' ') {
    return false;
  }
  out.status = std::atoi(std::string(answer.substr(9, 3)).c_str());
  const std::string headers(answer.substr(0, header_end));
  for (std::size_t pos = headers.find("\r\n"); pos != std::string::npos; pos = headers.find("\r\n", pos + 2)) {
    const std::string_view line = std::string_view(headers).substr(pos + 2, headers.find("\r\n", pos + 2) - pos - 2);
    if (line.size() > 15 && strncasecmp(line.data(), "Content-Length:", 15) == 0) {
      out.content_length = std::atoll(std::string(line.substr(15)).c_str());
    }
  }
  out.rest = answer.substr(header_end + 4);
  return true;
}

void fuzz_http(const std::uint8_t* data, std::size_t size) {
  static HttpFixture fixture;
  const std::string_view request(reinterpret_cast<const char*>(data), std::min<std::size_t>(size, 64 * 1024));
  const std::string answer = exchange(fixture.port(), request);
  if (answer.empty()) return;  // closed without a word: allowed for garbage
  Response response;
  if (!first_response(answer, response)) fail("an answer that is not HTTP: " + answer.substr(0, 200));
  if (response.status < 100 || response.status > 599) fail("status " + std::to_string(response.status));
  // Only well-formed requests for our paths reach the checks below.
  const bool head = request.rfind("HEAD ", 0) == 0;
  const bool get = request.rfind("GET ", 0) == 0;
  const std::size_t line_end = request.find("\r\n");
  const std::string_view request_line = request.substr(0, line_end);
  const bool metrics = request_line.find(" /metrics ") != std::string_view::npos;
  const bool healthz = request_line.find(" /healthz ") != std::string_view::npos;
  if (head && response.status == 200 && !response.rest.empty() && response.rest.rfind("HTTP/1.1 ", 0) != 0) {
    fail("HEAD answered with a body: " + std::string(response.rest.substr(0, 100)));
  }
  if (get && response.status == 200 && response.content_length >= 0 &&
      response.rest.size() >= static_cast<std::size_t>(response.content_length)) {
    const std::string_view body = response.rest.substr(0, static_cast<std::size_t>(response.content_length));
    if (metrics) {
      if (const std::string why = check_exposition(body); !why.empty()) fail("/metrics over HTTP: " + why);
    }
    if (healthz && body.rfind("ok\n", 0) != 0) fail("/healthz body: " + std::string(body));
  }
  // Whatever came before, the server still answers /healthz.
  static unsigned calls = 0;
  if (++calls % 64 == 0) {
    const HttpResult health = http_get("127.0.0.1", fixture.port(), "/healthz", "", 15000);
    if (health.status != 200) fail("/healthz answered " + std::to_string(health.status));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // The event log would drown the fuzzer's output; GAUGEWATCH_FUZZ_LOG=info
  // shows it when reading what an input did.
  const char* level = std::getenv("GAUGEWATCH_FUZZ_LOG");
  configure_event_log(level != nullptr ? level : "off", LogFormat::kText);
  // protobuf logs every string field that is not UTF-8; the fuzzer makes many.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  switch (static_cast<Target>(data[0] % static_cast<unsigned>(Target::kCount))) {
    case Target::kController: fuzz_controller(data + 1, size - 1); break;
    case Target::kHttp: fuzz_http(data + 1, size - 1); break;
    case Target::kCount: break;
  }
  return 0;
}
