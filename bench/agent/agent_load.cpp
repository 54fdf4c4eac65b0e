// gaugewatch agent load benchmark.
//
// Starts the real gaugewatch-agent binary (temp dir, unix socket, HTTP on a
// free port), connects N simulated trainers x L layers over real gRPC, and
// streams sample batches as fast as the agent takes them for a fixed time.
// Reports, all measured here:
//   samples_per_second   agent's gaugewatch_agent_samples_received_total delta / time
//   ingest_p50/p99       from the agent's gaugewatch_agent_sample_age_seconds
//                        histogram (trainer stamps unix_time_ns just before the
//                        write; the agent observes now - stamp when it applies
//                        the sample), interpolated within the bucket
//   scrape_ms            client-side GET /metrics time with the trainers idle
//                        (median and max of 5), and the agent's own render time
//   ingest_scrape_ms     client-side GET /metrics time while the trainers stream
//                        (median and max; one scrape every --scrape-interval s,
//                        0 = no scrapes during ingest)
//   series               gaugewatch_agent_series after the run
//   agent_rss_mib        VmRSS / VmHWM of the agent process
//   client_cpu_us_per_sample  the same for this process (the simulated
//                        trainers and the scraper), which shares the cores
//   scrape_bodies_short  scrapes whose body ended before its Content-Length
//   agent_cpu_us_per_sample  the agent's CPU time (user + system, all threads)
//                        over the ingest window per sample received: what
//                        ingest costs, independent of how busy the machine is
//
// Usage: gaugewatch_agent_load --agent PATH [--trainers 16] [--layers 28]
//        [--batch 64] [--seconds 10] [--rate samples/s, 0 = flat out]
//        [--scrape-interval 1] [--label name]
//        (prints one JSON object)

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "agent/common/clock.h"
#include "agent/export/http_server.h"
#include "agent/testing/sim_trainer.h"
#include "tests/agent/subprocess.h"
#include "tests/agent/temp_dir.h"

namespace {

using namespace gaugewatch::agent;
namespace v1 = gaugewatch::v1;

struct Args {
  std::string agent;
  std::uint32_t trainers = 16;
  std::uint32_t layers = 28;
  std::uint32_t batch = 64;
  double seconds = 10;
  std::string label = "run";
  double rate = 0;  // total samples/s to offer; 0 = as fast as the agent takes them
  double scrape_interval = 1;  // seconds between scrapes during ingest; 0 = none
};

// Median and max of a list of times (NAN when empty).
std::pair<double, double> median_max(std::vector<double> values) {
  if (values.empty()) return {NAN, NAN};
  std::sort(values.begin(), values.end());
  return {values[values.size() / 2], values.back()};
}

double metric_value(const std::string& text, const std::string& sample) {
  const auto at = text.find("\n" + sample + " ");
  if (at == std::string::npos) return NAN;
  return std::strtod(text.c_str() + at + sample.size() + 2, nullptr);
}

// Percentile from the cumulative histogram, linear within the bucket.
double histogram_quantile(const std::string& text, double q) {
  std::vector<std::pair<double, double>> buckets;  // (le, cumulative)
  const std::regex line("gaugewatch_agent_sample_age_seconds_bucket\\{le=\"([^\"]+)\"\\} ([0-9.e+-]+)");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), line); it != std::sregex_iterator(); ++it) {
    const std::string le = (*it)[1];
    buckets.emplace_back(le == "+Inf" ? INFINITY : std::stod(le), std::stod((*it)[2]));
  }
  if (buckets.empty() || buckets.back().second == 0) return NAN;
  const double rank = q * buckets.back().second;
  double lower = 0, below = 0;
  for (const auto& [le, count] : buckets) {
    if (count >= rank) {
      if (std::isinf(le)) return lower;
      return lower + (le - lower) * (rank - below) / std::max(count - below, 1.0);
    }
    lower = le;
    below = count;
  }
  return NAN;
}

double rss_mib(pid_t pid, const char* field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) return std::strtod(line.c_str() + std::strlen(field) + 1, nullptr) / 1024.0;
  }
  return NAN;
}

bool cut_short(const HttpResult& result) {
  return result.content_length >= 0 && static_cast<std::size_t>(result.content_length) != result.body.size();
}

// User + system CPU seconds of a process, all threads (/proc/PID/stat).
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return NAN;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; fields >> field; ++i) {  // field 3 is the state
    if (i == 14) utime = std::strtod(field.c_str(), nullptr);
    if (i == 15) {
      stime = std::strtod(field.c_str(), nullptr);
      break;
    }
  }
  return (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const std::string value = argv[i + 1];
    if (key == "--agent") args.agent = value;
    else if (key == "--trainers") args.trainers = static_cast<std::uint32_t>(std::stoul(value));
    else if (key == "--layers") args.layers = static_cast<std::uint32_t>(std::stoul(value));
    else if (key == "--batch") args.batch = static_cast<std::uint32_t>(std::stoul(value));
    else if (key == "--seconds") args.seconds = std::stod(value);
    else if (key == "--label") args.label = value;
    else if (key == "--rate") args.rate = std::stod(value);
    else if (key == "--scrape-interval") args.scrape_interval = std::stod(value);
    else {
      std::cerr << "unknown flag " << key << "\n";
      return 2;
    }
  }
  if (args.agent.empty()) {
    std::cerr << "usage: gaugewatch_agent_load --agent PATH [--trainers N] [--layers L] [--batch B] [--seconds T]\n";
    return 2;
  }
  TempDir dir;
  const std::string socket = dir.path() + "/agent.sock";
  // Flat-out runs measure the agent's capacity: no per-trainer rate limit.
  // Paced runs keep the embedded default limit (and report what it shed).
  std::vector<std::string> agent_args = {args.agent, "--grpc-socket", socket, "--http-listen", "127.0.0.1:0",
                                         "--database", dir.path() + "/agent.db", "--max-series", "1000000",
                                         "--default-rules", "false"};
  if (args.rate == 0) {
    agent_args.push_back("--trainer-sample-rate");
    agent_args.push_back("0");
  }
  Subprocess agent(agent_args, dir.path() + "/agent.log");
  std::uint16_t port = 0;
  for (int i = 0; i < 500 && port == 0; ++i) {
    std::smatch match;
    const std::string log = agent.log();
    if (std::regex_search(log, match, std::regex("http port: +([0-9]+)"))) port = static_cast<std::uint16_t>(std::stoi(match[1]));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (port == 0) {
    std::cerr << "agent did not start:\n" << agent.log();
    return 1;
  }
  const pid_t pid = agent.pid();

  auto channel_args = grpc::ChannelArguments();
  std::vector<std::unique_ptr<SimTrainer>> trainers;
  for (std::uint32_t r = 0; r < args.trainers; ++r) {
    // One channel (connection) per trainer, as separate processes would have.
    channel_args.SetInt("gaugewatch.bench.trainer", static_cast<int>(r));
    auto channel = grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), channel_args);
    trainers.push_back(std::make_unique<SimTrainer>(
        channel, SimTrainer::make_hello("bench-run-" + std::to_string(r / 8), r, args.trainers, args.layers)));
    if (!trainers.back()->start()) {
      std::cerr << "trainer " << r << " could not connect\n";
      return 1;
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> sent{0};
  std::vector<std::thread> threads;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string before = http_get("127.0.0.1", port, "/metrics").body;
  const double cpu_before = cpu_seconds(pid);
  const double client_cpu_before = cpu_seconds(::getpid());
  for (std::uint32_t r = 0; r < args.trainers; ++r) {
    threads.emplace_back([&, r] {
      // One message per trainer, restamped in place for each send (as the
      // hooks' reporter reuses its batch): the client spends its share of the
      // two cores on serializing, not on copying.
      v1::TrainerMessage message;
      v1::SampleBatch& batch = *message.mutable_samples();
      for (std::uint32_t i = 0; i < args.batch; ++i) {
        *batch.add_samples() = SimTrainer::make_sample(0, i % args.layers, 0.01);
      }
      std::uint64_t step = 0;
      std::uint32_t next_layer = 0;
      // Paced: each trainer offers rate / trainers samples per second.
      const double period_s = args.rate > 0 ? args.batch * args.trainers / args.rate : 0;
      auto next = std::chrono::steady_clock::now();
      while (!stop.load(std::memory_order_relaxed)) {
        if (period_s > 0) {
          next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(period_s));
          std::this_thread::sleep_until(next);
        }
        ++step;
        const std::int64_t now = unix_now_ns();
        for (auto& sample : *batch.mutable_samples()) {
          sample.set_step(step);
          sample.set_layer(next_layer);
          next_layer = (next_layer + 1) % args.layers;
          sample.set_unix_time_ns(now);
        }
        if (!trainers[r]->send(message)) break;
        sent.fetch_add(args.batch, std::memory_order_relaxed);
      }
    });
  }
  // Scrapes while the trainers stream: what Prometheus sees under full ingest.
  std::vector<double> ingest_scrape_ms;
  std::size_t short_bodies = 0;  // scrapes whose body ended before its Content-Length
  const auto ingest_end = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(args.seconds));
  if (args.scrape_interval > 0) {
    const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(args.scrape_interval));
    auto next = t0 + interval;
    while (next < ingest_end) {
      std::this_thread::sleep_until(next);
      const auto s0 = std::chrono::steady_clock::now();
      if (cut_short(http_get("127.0.0.1", port, "/metrics"))) ++short_bodies;
      const auto s1 = std::chrono::steady_clock::now();
      ingest_scrape_ms.push_back(std::chrono::duration<double, std::milli>(s1 - s0).count());
      next = std::max(next + interval, s1);
    }
  }
  std::this_thread::sleep_until(ingest_end);
  const std::string after = http_get("127.0.0.1", port, "/metrics").body;
  const double cpu_after = cpu_seconds(pid);
  const double client_cpu_after = cpu_seconds(::getpid());
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  for (auto& t : threads) t.join();
  const double received =
      metric_value(after, "gaugewatch_agent_samples_received_total") -
      metric_value(before, "gaugewatch_agent_samples_received_total");
  const std::string shed_sample = "gaugewatch_agent_samples_shed_total{reason=\"rate_limit\"}";
  const double shed = metric_value(after, shed_sample) - metric_value(before, shed_sample);

  // Scrape time with the trainers idle (what Prometheus sees between bursts).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::vector<double> scrape_ms;
  std::size_t bytes = 0;
  std::string last;
  for (int i = 0; i < 5; ++i) {
    const auto s0 = std::chrono::steady_clock::now();
    const auto got = http_get("127.0.0.1", port, "/metrics");
    last = got.body;
    if (cut_short(got)) ++short_bodies;
    scrape_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count());
    bytes = last.size();
  }
  std::sort(scrape_ms.begin(), scrape_ms.end());
  const auto [ingest_scrape_median, ingest_scrape_max] = median_max(ingest_scrape_ms);
  const double render_ms = metric_value(last, "gaugewatch_agent_scrape_duration_seconds") * 1000;
  const double series = metric_value(last, "gaugewatch_agent_series");
  const double lines = static_cast<double>(std::count(last.begin(), last.end(), '\n'));
  const double p50 = histogram_quantile(after, 0.50) * 1000;
  const double p99 = histogram_quantile(after, 0.99) * 1000;
  const double rss = rss_mib(pid, "VmRSS:");
  const double hwm = rss_mib(pid, "VmHWM:");
  for (auto& t : trainers) t->finish();
  agent.stop(SIGTERM, std::chrono::seconds(10));

  std::printf(
      "{\"label\": \"%s\", \"offered_rate\": %.0f, \"trainers\": %u, \"layers\": %u, \"batch\": %u, \"seconds\": %.2f, "
      "\"samples_sent\": %llu, \"samples_received\": %.0f, \"samples_shed\": %.0f, \"samples_per_second\": %.0f, "
      "\"ingest_p50_ms\": %.3f, \"ingest_p99_ms\": %.3f, \"layer_series\": %.0f, "
      "\"exposition_lines\": %.0f, \"exposition_bytes\": %zu, \"scrape_ms_median\": %.1f, "
      "\"scrape_ms_max\": %.1f, \"scrape_interval_s\": %.2f, \"ingest_scrapes\": %zu, "
      "\"ingest_scrape_ms_median\": %.1f, \"ingest_scrape_ms_max\": %.1f, \"render_ms\": %.1f, \"agent_rss_mib\": %.1f, \"agent_peak_rss_mib\": %.1f, "
      "\"agent_cpu_us_per_sample\": %.3f, \"client_cpu_us_per_sample\": %.3f, \"scrape_bodies_short\": %zu}\n",
      args.label.c_str(), args.rate, args.trainers, args.layers, args.batch, elapsed,
      static_cast<unsigned long long>(sent.load()), received, shed, received / elapsed, p50, p99, series, lines,
      bytes, scrape_ms[2], scrape_ms[4], args.scrape_interval, ingest_scrape_ms.size(), ingest_scrape_median,
      ingest_scrape_max, render_ms, rss, hwm, (cpu_after - cpu_before) * 1e6 / received,
      (client_cpu_after - client_cpu_before) * 1e6 / received, short_bodies);
  return 0;
}
