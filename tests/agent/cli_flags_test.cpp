// The three command lines as their users meet them: the real binaries
// (gaugewatch-agent, gaugewatchctl, gaugewatch) run through a shell. A bad
// value exits 2 naming its flag (or variable); a variable stands in for its
// flag and the flag beats it; --version prints the project version.

#include <gtest/gtest.h>

#include <string>

#include "gaugewatch/version.h"
#include "tests/agent/subprocess.h"
#include "tests/agent/temp_dir.h"

namespace gaugewatch::agent {
namespace {

const std::string kAgent = GAUGEWATCH_AGENT_BIN;
const std::string kCtl = GAUGEWATCH_CTL_BIN;
const std::string kLauncher = GAUGEWATCH_CLI_BIN;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Runs `command` with no GAUGEWATCH_* variable of the test's own environment.
std::pair<int, std::string> run_clean(const std::string& command) {
  return run_command("env $(env | grep -o '^GAUGEWATCH_[A-Z_]*' | sed 's/^/-u /') " + command);
}

TEST(CliFlags, VersionIsTheProjectVersionOnAllThree) {
  for (const auto& [binary, name] : {std::pair{kAgent, "gaugewatch-agent"}, std::pair{kCtl, "gaugewatchctl"},
                                     std::pair{kLauncher, "gaugewatch"}}) {
    const auto [rc, out] = run_clean(binary + " --version");
    EXPECT_EQ(rc, 0) << out;
    EXPECT_EQ(out, std::string(name) + " " + GAUGEWATCH_VERSION + "\n");
  }
}

TEST(CliFlags, AgentRefusesBadValuesNamingTheFlag) {
  TempDir dir;
  const struct {
    std::string args;
    std::string names;
  } cases[] = {
      {"--max-series 12x", "--max-series"},
      {"--socket-mode 0999", "--socket-mode"},
      {"--log-format xml", "--log-format"},
      {"--log-level loud", "--log-level"},
      {"--rank-expiry-seconds -5", "--rank-expiry-seconds"},
      {"--tls-cert " + dir.path() + "/missing.pem", "--tls-cert"},
      {"--config " + dir.path() + "/missing.yaml", "--config"},
      {"--max-series", "--max-series"},
      {"--no-such-flag 1", "--no-such-flag"},
  };
  for (const auto& c : cases) {
    const auto [rc, out] = run_clean(kAgent + " --check-config " + c.args);
    EXPECT_EQ(rc, 2) << c.args << ": " << out;
    EXPECT_TRUE(contains(out, c.names)) << c.args << ": " << out;
  }
  const auto [rc, out] = run_clean("GAUGEWATCH_AGENT_TRAINER_SAMPLE_RATE=fast " + kAgent + " --check-config");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(contains(out, "GAUGEWATCH_AGENT_TRAINER_SAMPLE_RATE")) << out;
}

TEST(CliFlags, AgentVariablesStandInForFlagsAndFlagsWin) {
  TempDir dir;
  const std::string paths = " --check-config --grpc-socket " + dir.path() + "/a.sock --database " + dir.path() + "/a.db";
  auto [rc, out] = run_clean("GAUGEWATCH_AGENT_HTTP_LISTEN=127.0.0.1:4321 GAUGEWATCH_AGENT_TRAINER_SAMPLE_RATE=7 " +
                             kAgent + paths);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(contains(out, "http:        127.0.0.1:4321\n")) << out;
  EXPECT_TRUE(contains(out, "rate limit:  7 samples/s")) << out;
  std::tie(rc, out) = run_clean("GAUGEWATCH_AGENT_HTTP_LISTEN=127.0.0.1:4321 " + kAgent + paths +
                                " --http-listen 127.0.0.1:4322");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(contains(out, "http:        127.0.0.1:4322\n")) << out;
  std::tie(rc, out) = run_clean(kAgent + " --help");
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(contains(out, "--http-listen VALUE (Env:GAUGEWATCH_AGENT_HTTP_LISTEN)")) << out;
}

TEST(CliFlags, CtlRefusesBadValuesNamingTheFlag) {
  const struct {
    std::string args;
    std::string names;
  } cases[] = {
      {"--timeout -1 status", "--timeout"},
      {"status --timeout soon", "--timeout"},
      {"switch --run r --backend turbo", "--backend"},
      {"switch --run r", "--backend"},
      {"switch --run r --layers 1,x --backend gproj", "--layers"},
      {"switch --run r --all-runs --backend gproj", "--all-runs"},
      {"capture --run r", "--layer"},
      {"capture --run r --layer 1 --count 0", "--count"},
      {"sampling --run r --layer-fraction 1.5", "--layer-fraction"},
      {"history --limit 0", "--limit"},
      {"--tls-ca /nonexistent/ca.pem status", "--tls-ca"},
      {"status --every 3", "--every"},  // a flag of another command
      {"frobnicate", "unknown command 'frobnicate'"},
  };
  for (const auto& c : cases) {
    const auto [rc, out] = run_clean(kCtl + " " + c.args);
    EXPECT_EQ(rc, 2) << c.args << ": " << out;
    EXPECT_TRUE(contains(out, c.names)) << c.args << ": " << out;
  }
  const auto [rc, out] = run_clean("GAUGEWATCH_TIMEOUT=abc " + kCtl + " status");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(contains(out, "GAUGEWATCH_TIMEOUT")) << out;
}

TEST(CliFlags, CtlVariablesStandInForFlagsAndFlagsWin) {
  TempDir dir;
  // Nobody listens: the error names the socket the call went to.
  auto [rc, out] = run_clean("GAUGEWATCH_SOCKET=" + dir.path() + "/env.sock GAUGEWATCH_TIMEOUT=1 " + kCtl + " status");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(contains(out, "unix:" + dir.path() + "/env.sock")) << out;
  std::tie(rc, out) = run_clean("GAUGEWATCH_SOCKET=" + dir.path() + "/env.sock " + kCtl + " status --timeout 1 --socket " +
                                dir.path() + "/flag.sock");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_TRUE(contains(out, "unix:" + dir.path() + "/flag.sock")) << out;
  // Every command has its own --help, listing only its flags.
  std::tie(rc, out) = run_clean(kCtl + " switch --help");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(contains(out, "--backend")) << out;
  EXPECT_FALSE(contains(out, "--every")) << out;
  std::tie(rc, out) = run_clean(kCtl + " --help");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_TRUE(contains(out, "--socket PATH (Env:GAUGEWATCH_SOCKET)")) << out;
}

TEST(CliFlags, LauncherRefusesBadValuesNamingTheFlag) {
  auto [rc, out] = run_clean(kLauncher + " run --sample-every often -- true");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(contains(out, "--sample-every")) << out;
  std::tie(rc, out) = run_clean("GAUGEWATCH_LAYER_FRACTION=3 " + kLauncher + " run -- true");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_TRUE(contains(out, "--layer-fraction")) << out;
}

}  // namespace
}  // namespace gaugewatch::agent
