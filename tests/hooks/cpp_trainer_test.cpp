// The libtorch C++ trainer (cpp_trainer.cpp, linked with the hooks) against
// a real gaugewatch-agent process on a real unix socket: samples arrive under
// the C++ API's layer names, an admin switch (gaugewatchctl) reaches the
// trainer and takes effect at a step boundary, loss decreases.

#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// stdout to `out`, stderr to `out`.err (or to `out` too with merge).
pid_t spawn(const std::vector<std::string>& argv, const std::string& out, bool merge = false) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (merge) {
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  } else {
    posix_spawn_file_actions_addopen(&actions, 2, (out + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string run(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  if (p != nullptr) ::pclose(p);
  return out;
}

template <typename F>
bool eventually(F f, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (f()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

TEST(CppTrainer, MonitoredAndSwitchedThroughARealAgent) {
  char pattern[] = "/tmp/gwh-cpp-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const std::string socket = dir + "/agent.sock";
  const pid_t agent = spawn({GAUGEWATCH_AGENT_BIN, "--grpc-socket", socket, "--http-listen", "127.0.0.1:0",
                             "--database", dir + "/agent.db", "--default-rules", "false"},
                            dir + "/agent.log", /*merge=*/true);
  ASSERT_GT(agent, 0);
  // Stop the agent and remove the directory however the test ends.
  struct Cleanup {
    pid_t pid;
    std::string dir;
    ~Cleanup() {
      if (pid > 0 && ::kill(pid, SIGTERM) == 0) ::waitpid(pid, nullptr, 0);
      std::error_code ignored;
      std::filesystem::remove_all(dir, ignored);
    }
  } cleanup{agent, dir};
  ASSERT_TRUE(eventually([&] { return read(dir + "/agent.log").find("ready") != std::string::npos; }, 20s));

  ::setenv("GAUGEWATCH_SOCKET", socket.c_str(), 1);
  ::setenv("GAUGEWATCH_RUN_ID", "cpp-trainer", 1);
  ::setenv("GAUGEWATCH_SAMPLE_EVERY", "1", 1);
  ::setenv("GAUGEWATCH_LAYER_FRACTION", "1", 1);
  ::setenv("GAUGEWATCH_MAX_ROWS", "16", 1);
  ::setenv("GAUGEWATCH_OVERHEAD_BUDGET", "1", 1);
  ::setenv("GAUGEWATCH_STATS_FILE", (dir + "/stats.json").c_str(), 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  const pid_t trainer = spawn({GAUGEWATCH_CPP_TRAINER_BIN, "60", "20"}, dir + "/trainer.out");
  ASSERT_GT(trainer, 0);

  const std::string ctl = std::string(GAUGEWATCH_CTL_BIN) + " --socket " + socket + " ";
  // Samples under the C++ API's names; then an operator switches layer 2 to pivot.
  ASSERT_TRUE(eventually([&] { return run(ctl + "layers --run cpp-trainer").find("blocks.2.attn") != std::string::npos; },
                         60s))
      << read(dir + "/trainer.out.err");
  const std::string switched = run(ctl + "switch --run cpp-trainer --layers 2 --backend pivot --reason test");
  const int rc = wait_exit(trainer);
  const std::string out = read(dir + "/trainer.out");
  const std::string layers = run(ctl + "--json layers --run cpp-trainer");
  const std::string history = run(ctl + "--json history --run cpp-trainer --audit");
  ASSERT_EQ(rc, 0) << read(dir + "/trainer.out.err");

  std::vector<double> losses;
  json stats;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    const json j = json::parse(line);
    if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
    if (j.contains("done")) stats = j["stats"];
  }
  ASSERT_EQ(losses.size(), 60u);
  EXPECT_LT(losses.back(), 0.5 * losses.front());

  ASSERT_EQ(stats["layers"].size(), 3u) << stats.dump();
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(stats["layers"][l]["name"], "blocks." + std::to_string(l) + ".attn");
    EXPECT_EQ(stats["layers"][l]["backward_calls"], 60);
  }
  // Layer 2: stock until the boundary after the switch, pivot from then on.
  const json& h = stats["layers"][2]["history"];
  ASSERT_EQ(h.size(), 2u) << stats.dump() << "\n" << switched;
  EXPECT_EQ(h[1][1], "pivot");
  const int switch_step = h[1][0].get<int>();
  EXPECT_EQ(stats["backward_calls"]["pivot"], 60 - switch_step);
  EXPECT_EQ(stats["layers"][0]["history"].size(), 1u);
  EXPECT_NE(history.find("\"detail\": \"step " + std::to_string(switch_step) + "\""), std::string::npos) << history;

  const json agent_layers = json::parse(layers)["runs"][0]["ranks"][0]["layers"];
  ASSERT_EQ(agent_layers.size(), 3u);
  for (const auto& layer : agent_layers) EXPECT_GT(std::stoi(layer["samples"].get<std::string>()), 0) << layer.dump();
  EXPECT_EQ(agent_layers[2]["backend"], "BACKEND_PIVOT");
}

}  // namespace
