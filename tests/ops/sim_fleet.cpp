// gaugewatch_sim_fleet: simulated trainers (real gRPC clients, SimTrainer)
// that play the operators' scenarios against one or two live agents, for the
// panel test (tests/python/test_panels.py) and the status page test.
//
//   gaugewatch_sim_fleet --socket-a PATH [--socket-b PATH] --seconds N --ready-file F
//
// Node A (default rules on, short rank expiry) gets one run per scenario:
//   healthy        2 ranks x 4 layers, all metrics quiet: no alert
//   switched       layer 1 leaks on stock; the agent's default rule switches it,
//                  the trainer applies it and reports gproj with a small error
//   unswitchable   layer 2 leaks; the trainer rejects the switch and stays on stock
//   still-high     layer 0 leaks; switched to gproj, the error stays high
//   drifting       layer 3's key offset/spread ratio grows (dQ still fine)
//   translation    layer 0's live gauge violation is high (dQ fine)
//   gproj-inexact  GProj's own dQ error is 5% on layer 2
//   coverage       dropout calls the hooks cannot audit, besides monitored ones
//   silent         stops sending after 3 s without a goodbye (a hung trainer)
//   finished       says goodbye after 3 s and closes (a clean end)
//   dropping       the hook reports samples dropped from its queue
// Node B (a low per-trainer rate limit and a small series limit, set by the
// test) gets: flood (over the rate limit), wide (40 layers: over the series
// limit) and one Hello with an invalid run id (rejected).
// Each trainer reports its rank's GPU identity (host, local rank, GPU UUID,
// PCI bus id) in its Hello. The ready file is written once every trainer's
// Hello was acknowledged.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/testing/sim_trainer.h"

namespace {

namespace v1 = gaugewatch::v1;
using gaugewatch::agent::SimTrainer;
using Clock = std::chrono::steady_clock;

// A quiet layer: every catalogue metric at a healthy value.
void set_quiet(v1::LayerMetrics& m) {
  m.set_row_mass_abs_max(0.02);
  m.set_row_mass_abs_mean(0.005);
  m.set_row_mass_normalized_max(0.01);
  m.set_row_mass_normalized_mean(0.002);
  m.set_key_offset_median(0.8);
  m.set_key_offset_max(1.5);
  m.set_key_spread_median(1.0);
  m.set_key_offset_spread_ratio_median(0.8);
  m.set_key_offset_spread_ratio_max(1.6);
  m.set_key_rms(1.2);
  m.set_sharp_row_fraction(0.05);
  m.set_logit_abs_max(12.0);
  m.set_live_dq_discrepancy(0.004);
  m.set_live_dk_discrepancy(0.004);
  m.set_live_dv_discrepancy(0.003);
  m.set_gproj_dq_discrepancy(0.002);
  m.set_gproj_dk_discrepancy(0.002);
  m.set_gproj_dv_discrepancy(0.002);
  m.set_live_gauge_violation(0.001);
  m.set_gproj_gauge_violation(0.0005);
}

// Metrics of one sample: (layer, backend it runs, seconds since start, metrics).
using Shape = std::function<void(std::uint32_t, v1::Backend, double, v1::LayerMetrics&)>;

struct Scenario {
  std::string run;
  std::uint32_t ranks = 1;
  std::uint32_t layers = 4;
  Shape shape = [](std::uint32_t, v1::Backend, double, v1::LayerMetrics&) {};
  bool reject_switches = false;
  double stop_after_s = -1;     // stop sending (no goodbye)
  double goodbye_after_s = -1;  // goodbye, then close the stream
  double period_s = 0.2;
  std::uint32_t repeat = 1;     // samples per layer per tick
  bool unmonitored_calls = false;
  bool hook_drops = false;
};

struct Trainer {
  Scenario scenario;
  std::uint32_t rank = 0;
  std::unique_ptr<SimTrainer> client;
  std::vector<v1::Backend> backends;
  std::size_t commands_seen = 0;
  std::uint64_t step = 0;
  double next_tick_s = 0;
  bool done = false;
};

// A leak on `layer` while it runs stock (or a non-correcting backend).
Shape leak_on(std::uint32_t layer, double corrected_dq) {
  return [layer, corrected_dq](std::uint32_t l, v1::Backend b, double, v1::LayerMetrics& m) {
    if (l != layer) return;
    m.set_key_offset_spread_ratio_median(2.5);
    m.set_live_dq_discrepancy(b == v1::BACKEND_STOCK ? 0.30 : corrected_dq);
    if (b == v1::BACKEND_STOCK) m.set_live_gauge_violation(0.02);
  };
}

std::vector<Scenario> node_a() {
  std::vector<Scenario> out;
  out.push_back({.run = "healthy", .ranks = 2});
  // One sample a second: the leak before the switch stays in the layer's
  // recent history (the status page's sparkline) for a minute.
  out.push_back({.run = "switched", .shape = leak_on(1, 0.002), .period_s = 1.0});
  out.push_back({.run = "unswitchable", .shape = leak_on(2, 0.002), .reject_switches = true,
                 .period_s = 1.0});
  out.push_back({.run = "still-high", .shape = leak_on(0, 0.20), .period_s = 1.0});
  out.push_back({.run = "drifting",
                 .shape = [](std::uint32_t l, v1::Backend, double t, v1::LayerMetrics& m) {
                   if (l == 3) m.set_key_offset_spread_ratio_median(3.5 + 0.1 * t);
                 }});
  out.push_back({.run = "translation",
                 .shape = [](std::uint32_t l, v1::Backend, double, v1::LayerMetrics& m) {
                   if (l == 0) m.set_live_gauge_violation(0.2);
                 }});
  out.push_back({.run = "gproj-inexact",
                 .shape = [](std::uint32_t l, v1::Backend, double, v1::LayerMetrics& m) {
                   if (l == 2) m.set_gproj_dq_discrepancy(0.05);
                 }});
  out.push_back({.run = "coverage", .unmonitored_calls = true});
  out.push_back({.run = "silent", .stop_after_s = 3});
  out.push_back({.run = "finished", .goodbye_after_s = 3});
  out.push_back({.run = "dropping", .hook_drops = true});
  return out;
}

std::vector<Scenario> node_b() {
  return {
      {.run = "flood", .layers = 1, .repeat = 60},
      {.run = "wide", .layers = 40, .period_s = 1.0},
  };
}

v1::Hello hello_for(const Scenario& s, std::uint32_t rank, const std::string& node) {
  v1::Hello hello = SimTrainer::make_hello(s.run, rank, s.ranks, s.layers);
  hello.set_host("sim-node-" + node);
  hello.set_local_rank(rank);
  char uuid[64];
  std::snprintf(uuid, sizeof uuid, "GPU-5f3c%04x-0000-4000-8000-%012x", rank, static_cast<unsigned>(
                    std::hash<std::string>{}(s.run) & 0xffffff));
  hello.set_gpu_uuid(uuid);
  char bus[32];
  std::snprintf(bus, sizeof bus, "00000000:%02X:00.0", 0x19 + rank);
  hello.set_pci_bus_id(bus);
  for (int i = 0; i < hello.layers_size(); ++i) {
    hello.mutable_layers(i)->set_name("model.layers." + std::to_string(i) + ".self_attn");
  }
  return hello;
}

// Applies (or rejects) the agent's new commands, as the hooks would.
void handle_commands(Trainer& t) {
  const auto commands = t.client->commands();
  for (; t.commands_seen < commands.size(); ++t.commands_seen) {
    const v1::Command& c = commands[t.commands_seen];
    if (c.has_switch_backend()) {
      if (t.scenario.reject_switches) {
        t.client->ack(c.command_id(), false, t.step);
        continue;
      }
      for (const auto layer : c.switch_backend().layers()) {
        if (layer < t.backends.size()) t.backends[layer] = c.switch_backend().backend();
      }
      t.client->ack(c.command_id(), true, t.step + 1);
    } else {
      t.client->ack(c.command_id(), true, t.step + 1);
    }
  }
}

void tick(Trainer& t, double now_s) {
  handle_commands(t);
  const Scenario& s = t.scenario;
  if (s.goodbye_after_s >= 0 && now_s >= s.goodbye_after_s) {
    v1::TrainerMessage bye;
    bye.mutable_goodbye()->set_last_step(t.step);
    bye.mutable_goodbye()->set_reason("exit");
    t.client->send(bye);
    t.client->finish();
    t.done = true;
    return;
  }
  if (s.stop_after_s >= 0 && now_s >= s.stop_after_s) return;  // hung: sends nothing
  v1::SampleBatch batch;
  for (std::uint32_t r = 0; r < s.repeat; ++r) {
    ++t.step;
    for (std::uint32_t layer = 0; layer < s.layers; ++layer) {
      v1::Sample sample = SimTrainer::make_sample(t.step, layer, 0.0);
      sample.set_backend(t.backends[layer]);
      sample.set_unix_time_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::system_clock::now().time_since_epoch())
                                  .count());
      auto* m = sample.mutable_metrics();
      set_quiet(*m);
      s.shape(layer, t.backends[layer], now_s, *m);
      *batch.add_samples() = sample;
    }
  }
  const std::uint64_t calls = t.step * s.layers;
  auto* monitored = batch.add_attention_calls();
  monitored->set_monitored(true);
  monitored->set_calls_total(calls);
  if (s.unmonitored_calls) {
    auto* dropout = batch.add_attention_calls();
    dropout->set_monitored(false);
    dropout->set_reason("dropout");
    dropout->set_calls_total(calls / 2);
  }
  if (s.hook_drops) batch.set_dropped_total(t.step * 3);
  t.client->send_batch(batch);
}

int usage(const char* why) {
  std::cerr << "gaugewatch_sim_fleet: " << why
            << "\nusage: gaugewatch_sim_fleet --socket-a PATH [--socket-b PATH] --seconds N "
               "--ready-file FILE\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket_a, socket_b, ready_file;
  double seconds = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--socket-a") socket_a = value;
    else if (flag == "--socket-b") socket_b = value;
    else if (flag == "--seconds") seconds = std::stod(value);
    else if (flag == "--ready-file") ready_file = value;
    else return usage(("unknown flag " + flag).c_str());
  }
  if (socket_a.empty() || seconds <= 0 || ready_file.empty()) return usage("missing flags");

  std::vector<std::unique_ptr<Trainer>> trainers;
  auto start_node = [&](const std::string& socket, const std::string& node,
                        const std::vector<Scenario>& scenarios) {
    for (const auto& s : scenarios) {
      for (std::uint32_t rank = 0; rank < s.ranks; ++rank) {
        auto t = std::make_unique<Trainer>();
        t->scenario = s;
        t->rank = rank;
        t->backends.assign(s.layers, v1::BACKEND_STOCK);
        auto channel = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
        t->client = std::make_unique<SimTrainer>(channel, hello_for(s, rank, node));
        if (!t->client->start()) {
          std::cerr << "gaugewatch_sim_fleet: run " << s.run << " rank " << rank
                    << ": the agent at " << socket << " did not acknowledge the Hello\n";
          std::exit(1);
        }
        trainers.push_back(std::move(t));
      }
    }
  };
  start_node(socket_a, "a", node_a());
  if (!socket_b.empty()) {
    start_node(socket_b, "b", node_b());
    // An invalid run id: the agent refuses the Hello and counts the rejection.
    v1::Hello bad = SimTrainer::make_hello("bad run id!", 0, 1, 1);
    auto channel = grpc::CreateChannel("unix:" + socket_b, grpc::InsecureChannelCredentials());
    SimTrainer rejected(channel, bad);
    if (rejected.start(std::chrono::seconds(5))) {
      std::cerr << "gaugewatch_sim_fleet: the agent accepted an invalid run id\n";
      return 1;
    }
    rejected.wait_end(std::chrono::seconds(5));
  }
  std::ofstream(ready_file) << trainers.size() << " trainers\n";

  const auto t0 = Clock::now();
  for (;;) {
    const double now_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (now_s >= seconds) break;
    for (auto& t : trainers) {
      if (t->done || now_s < t->next_tick_s) continue;
      tick(*t, now_s);
      t->next_tick_s = now_s + t->scenario.period_s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& t : trainers) {
    if (!t->done) t->client->finish();
  }
  return 0;
}
