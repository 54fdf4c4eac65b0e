// Writes the protobuf-aware seed corpora of the agent's fuzz targets, or with
// --check verifies that the committed ones are what this program writes
// (CTest: agent_fuzz_seeds_current).
//
//   agent_fuzz_seeds [--check] AGENT_FUZZ_CORPUS LOGIC_FUZZ_CORPUS
//
// agent_fuzz (message parsing): one TrainerMessage of every payload type.
// agent_logic_fuzz: trainer sessions that reach every controller path a
// trainer or operator can (rules firing on one rank and run-wide, captures,
// acks applied, rejected and late, refusals, limits, expiry, reconnects,
// queries) and HTTP requests (GET, HEAD, /metrics, /healthz, the status page,
// pipelined, malformed).

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>

#include "agent/testing/sim_trainer.h"
#include "gaugewatch/v1/admin_service.pb.h"
#include "gaugewatch/v1/hook_service.pb.h"
#include "tests/agent/fuzz/logic_fuzz_input.h"

namespace {

using namespace gaugewatch::agent;
using namespace gaugewatch::agent::fuzz;
namespace v1 = gaugewatch::v1;

using Corpus = std::map<std::string, std::string>;  // file name -> bytes

v1::TrainerMessage hello(const std::string& run, std::uint32_t rank, std::uint32_t world, std::uint32_t layers) {
  v1::TrainerMessage message;
  *message.mutable_hello() = SimTrainer::make_hello(run, rank, world, layers);
  return message;
}

// A batch of one sample per layer in `layers` at `step`, every metric set:
// dQ discrepancy (the default rule), gauge violation and the offset/spread
// ratio (the example configuration's rules) as given.
v1::TrainerMessage batch(std::uint64_t step, std::initializer_list<std::uint32_t> layers, double dq,
                         double gauge_violation = 0.0, double offset_spread_ratio = 1.0) {
  v1::TrainerMessage message;
  auto* samples = message.mutable_samples();
  for (std::uint32_t layer : layers) {
    v1::Sample sample = SimTrainer::make_sample(step, layer, dq);
    sample.mutable_metrics()->set_live_gauge_violation(gauge_violation);
    sample.mutable_metrics()->set_key_offset_spread_ratio_max(offset_spread_ratio);
    sample.add_correcting_backends(v1::BACKEND_GPROJ);
    sample.add_correcting_backends(v1::BACKEND_FP32);
    *samples->add_samples() = sample;
  }
  samples->set_current_step(step);
  samples->set_dropped_total(step / 4);
  auto* monitored = samples->add_attention_calls();
  monitored->set_monitored(true);
  monitored->set_calls_total(step * 4);
  auto* skipped = samples->add_attention_calls();
  skipped->set_reason("dropout");
  skipped->set_calls_total(step);
  auto* status = samples->add_layer_status();
  status->set_layer(0);
  status->set_monitored(true);
  status->add_correcting_backends(v1::BACKEND_GPROJ);
  return message;
}

v1::TrainerMessage goodbye(std::uint64_t step) {
  v1::TrainerMessage message;
  message.mutable_goodbye()->set_last_step(step);
  message.mutable_goodbye()->set_reason("exit");
  return message;
}

// command_id picks the stream's first pending command (logic_fuzz_input.h).
v1::CommandAck ack(bool applied, std::uint64_t step, std::uint64_t rank_step = 0, std::uint64_t pick = 0) {
  v1::CommandAck out;
  out.set_command_id(pick);
  out.set_status(applied ? v1::ACK_STATUS_APPLIED : v1::ACK_STATUS_REJECTED);
  out.set_applied_step(applied ? step : 0);
  out.set_rank_step(rank_step);
  if (!applied) out.set_detail("late: rank at step " + std::to_string(rank_step));
  return out;
}

v1::ListRunsRequest query(const std::string& run, bool layers, std::uint32_t offset = 0) {
  v1::ListRunsRequest out;
  out.set_run_id(run);
  out.set_include_layers(layers);
  out.set_layer_offset(offset);
  return out;
}

v1::SetBackendRequest decide(const std::string& run, std::initializer_list<std::uint32_t> layers,
                             v1::Backend backend, const std::string& reason) {
  v1::SetBackendRequest out;
  if (run.empty()) {
    out.mutable_target()->set_all_runs(true);
  } else {
    out.mutable_target()->set_run_id(run);
  }
  for (auto layer : layers) out.mutable_target()->add_layers(layer);
  out.set_backend(backend);
  out.set_reason(reason);
  return out;
}

Corpus message_seeds() {
  Corpus corpus;
  const auto add = [&](const std::string& name, const v1::TrainerMessage& message) {
    corpus["seed_msg_" + name] = std::string(1, '\0') + message.SerializeAsString();  // selector 0: messages
  };
  add("hello", hello("seed-run", 1, 4, 6));
  add("samples", batch(40, {0, 1, 2}, 0.08, 0.2, 12.0));
  v1::TrainerMessage acked;
  *acked.mutable_ack() = ack(true, 41);
  acked.mutable_ack()->set_command_id(7);
  add("ack", acked);
  add("goodbye", goodbye(99));
  return corpus;
}

Corpus logic_seeds() {
  Corpus corpus;
  const auto controller = [&](const std::string& name, const RecordWriter& writer) {
    corpus["seed_ctl_" + name] = writer.bytes();
  };
  const std::string run = "seed-run";

  controller("session", RecordWriter(Target::kController)
                            .add(Action::kMessage, 0, hello(run, 0, 2, 4))
                            .add(Action::kMessage, 0, batch(1, {0, 1, 2, 3}, 0.01))
                            .add(Action::kMessage, 0, batch(2, {1, 3}, 0.02))
                            .add(Action::kQuery, 0, query(run, true))
                            .add(Action::kMessage, 0, goodbye(2)));

  // The default rule (dQ discrepancy > 5% for 3 samples) switches layer 1 to
  // gproj on this rank; the trainer applies it.
  RecordWriter rank_rule(Target::kController);
  rank_rule.add(Action::kMessage, 0, hello(run, 0, 1, 4));
  for (std::uint64_t step = 1; step <= 3; ++step) rank_rule.add(Action::kMessage, 0, batch(step, {1}, 0.2));
  rank_rule.add(Action::kAck, 0, ack(true, 4)).add(Action::kMessage, 0, batch(5, {1}, 0.01));
  rank_rule.add(Action::kQuery, 0, query("", true));
  controller("rank_rule_applied", rank_rule);

  // The example's run-scope rule (gauge violation > 0.10 for 5 samples)
  // switches the layer on both ranks; its capture rule (offset/spread ratio
  // > 1000) captures; one rank applies, the other is late.
  RecordWriter run_rule(Target::kController);
  run_rule.add(Action::kMessage, 0, hello(run, 0, 2, 4)).add(Action::kMessage, 1, hello(run, 1, 2, 4));
  for (std::uint64_t step = 1; step <= 5; ++step) {
    run_rule.add(Action::kMessage, 0, batch(step, {2}, 0.01, 0.5, step == 5 ? 2000.0 : 1.0));
    run_rule.add(Action::kMessage, 1, batch(step, {2}, 0.01, 0.01));
  }
  run_rule.add(Action::kAck, 0, ack(true, 8))
      .add(Action::kAck, 0, ack(true, 8))
      .add(Action::kAck, 1, ack(false, 0, 1'000'000))
      .add(Action::kAck, 1, ack(true, 0, 0, 99));  // one past the pending ones: an id never sent
  run_rule.add(Action::kQuery, 1, query(run, false));
  controller("run_rule_capture_late_ack", run_rule);

  controller("operator_switches", RecordWriter(Target::kController)
                                      .add(Action::kMessage, 0, hello(run, 0, 1, 6))
                                      .add(Action::kDecide, 0, decide(run, {0, 2}, v1::BACKEND_FP32, "seed"))
                                      .add(Action::kAck, 0, ack(true, 3))
                                      .add(Action::kDecide, 0, decide("", {}, v1::BACKEND_STOCK, ""))
                                      .add(Action::kDecide, 0, decide("other-run", {1}, v1::BACKEND_PIVOT, ""))
                                      .add(Action::kMessage, 1, hello("other-run", 0, 1, 2))
                                      .add(Action::kQuery, 0, query("", true, 2)));

  controller("reconnect_expire", RecordWriter(Target::kController)
                                     .add(Action::kMessage, 0, hello(run, 0, 1, 3))
                                     .add(Action::kMessage, 0, batch(1, {0, 1, 2}, 0.01))
                                     .add(Action::kReconnect, 0)
                                     .add(Action::kExpire, 0)
                                     .add(Action::kQuery, 0, query(run, true))
                                     .add(Action::kMessage, 0, hello(run, 0, 1, 3))
                                     .add(Action::kMessage, 0, batch(2, {0}, 0.01))
                                     .add(Action::kExpire, 0)
                                     .add(Action::kExpire, 0));

  v1::TrainerMessage bad_version = hello(run, 0, 1, 2);
  bad_version.mutable_hello()->set_protocol_version(v1::PROTOCOL_VERSION_UNSPECIFIED);
  controller("refusals", RecordWriter(Target::kController)
                             .add(Action::kMessage, 0, std::string("\xff\xff\xff not a message"))
                             .add(Action::kMessage, 0, batch(1, {0}, 0.01))  // before any Hello
                             .add(Action::kMessage, 1, bad_version)
                             .add(Action::kMessage, 2, hello(run, 0, 1, 17))  // more layers than the limit
                             .add(Action::kMessage, 3, hello(run, 5, 2, 2))   // rank >= world size
                             .add(Action::kMessage, 0, hello(run, 0, 1, 2))
                             .add(Action::kMessage, 0, hello(run, 0, 1, 2))  // a second Hello
                             .add(Action::kQuery, 0, query("", false)));

  // More ranks than limits.max_ranks (6), one stream after another.
  RecordWriter ranks(Target::kController);
  for (std::uint32_t rank = 0; rank < 8; ++rank) {
    ranks.add(Action::kMessage, rank % kStreams, hello(run, rank, 8, 16));
    ranks.add(Action::kMessage, rank % kStreams, batch(1, {0, 15}, 0.01));
    if (rank % kStreams == kStreams - 1) {
      for (unsigned slot = 0; slot < kStreams; ++slot) ranks.add(Action::kReconnect, slot);
    }
  }
  ranks.add(Action::kQuery, 0, query(run, true));
  controller("rank_limit", ranks);

  const auto http = [&](const std::string& name, const std::string& request) {
    corpus["seed_http_" + name] = std::string(1, static_cast<char>(Target::kHttp)) + request;
  };
  http("get_metrics", "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n");
  http("head_metrics", "HEAD /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n");
  http("get_healthz", "GET /healthz HTTP/1.0\r\n\r\n");
  http("head_healthz", "HEAD /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  http("status_page", "GET /?run=seed-run&run=fuzz-run HTTP/1.1\r\nHost: localhost\r\n\r\n");
  http("ui_query", "GET /ui?run=%66uzz-run&x HTTP/1.1\r\nHost: localhost\r\n\r\n");
  http("post", "POST /metrics HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\n\r\nbody");
  http("pipelined", "HEAD /metrics HTTP/1.1\r\nHost: a\r\n\r\nGET /healthz HTTP/1.1\r\nHost: a\r\n\r\n");
  http("unknown_path", "GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n");
  // A TLS ClientHello's first bytes (NULs included), then text.
  static constexpr char kTlsHello[] = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http at all\r\n\r\n";
  http("garbage", std::string(kTlsHello, sizeof kTlsHello - 1));
  http("long_header", "GET /metrics HTTP/1.1\r\nX-Long: " + std::string(9000, 'a') + "\r\n\r\n");
  http("incomplete", "GET /metrics HTTP/1.1\r\nHost: loc");
  return corpus;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "<missing>";
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Writes (or with `check`, compares) every seed; returns the files that differ.
int emit(const Corpus& corpus, const std::string& dir, bool check) {
  int differ = 0;
  for (const auto& [name, bytes] : corpus) {
    const std::string path = dir + "/" + name;
    if (check) {
      if (read_file(path) != bytes) {
        std::cerr << path << " differs from what agent_fuzz_seeds writes\n";
        ++differ;
      }
    } else if (!(std::ofstream(path, std::ios::binary) << bytes)) {
      std::cerr << "cannot write " << path << "\n";
      ++differ;
    }
  }
  return differ;
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc == 4 && std::string(argv[1]) == "--check";
  if (argc != 3 && !check) {
    std::cerr << "usage: agent_fuzz_seeds [--check] AGENT_FUZZ_CORPUS LOGIC_FUZZ_CORPUS\n";
    return 2;
  }
  const int first = check ? 2 : 1;
  const int differ = emit(message_seeds(), argv[first], check) + emit(logic_seeds(), argv[first + 1], check);
  if (differ != 0 && check) {
    std::cerr << "regenerate: agent_fuzz_seeds tests/agent/fuzz/corpus tests/agent/fuzz/logic_corpus\n";
  }
  return differ == 0 ? 0 : 1;
}
