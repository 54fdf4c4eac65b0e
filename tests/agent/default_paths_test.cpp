#include "agent/common/default_paths.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace gaugewatch {
namespace {

struct FakeEnv {
  std::map<std::string, std::string> values;
  const char* operator()(const char* name) const {
    const auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  }
};

TEST(DefaultPaths, RootUsesRunAndVarLib) {
  const auto paths = default_paths(0, FakeEnv{{{"XDG_RUNTIME_DIR", "/run/user/0"}}});
  EXPECT_EQ(paths.socket, "/run/gaugewatch/agent.sock");
  EXPECT_EQ(paths.database, "/var/lib/gaugewatch/agent.db");
  EXPECT_STREQ(paths.basis, "root");
}

TEST(DefaultPaths, UserUsesXdgDirectories) {
  const auto paths = default_paths(
      1000, FakeEnv{{{"XDG_RUNTIME_DIR", "/run/user/1000"}, {"XDG_STATE_HOME", "/home/a/.state"}, {"HOME", "/home/a"}}});
  EXPECT_EQ(paths.socket, "/run/user/1000/gaugewatch/agent.sock");
  EXPECT_EQ(paths.database, "/home/a/.state/gaugewatch/agent.db");
  EXPECT_STREQ(paths.basis, "user");
}

TEST(DefaultPaths, UserWithoutXdgFallsBackToTmpAndHome) {
  const auto paths = default_paths(1000, FakeEnv{{{"HOME", "/home/a"}, {"XDG_RUNTIME_DIR", "relative/ignored"}}});
  EXPECT_EQ(paths.socket, "/tmp/gaugewatch-1000/agent.sock");
  EXPECT_EQ(paths.database, "/home/a/.local/state/gaugewatch/agent.db");
  const auto bare = default_paths(1000, FakeEnv{});
  EXPECT_EQ(bare.database, "/tmp/gaugewatch-1000/gaugewatch/agent.db");
}

}  // namespace
}  // namespace gaugewatch
