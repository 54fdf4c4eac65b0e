// GAUGEWATCH_* configuration: defaults, torchrun / Slurm rank variables, bad values.

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "hooks/config.h"

namespace gaugewatch::hooks {
namespace {

HookConfig load(const std::map<std::string, std::string>& vars, std::vector<std::string>* warnings = nullptr) {
  return load_config(
      [&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      warnings);
}

TEST(HookConfig, DefaultsMatchTheAgent) {
  const HookConfig c = load({});
  EXPECT_EQ(c.socket, "/run/gaugewatch/agent.sock");
  EXPECT_TRUE(c.agent_enabled());
  EXPECT_EQ(c.rank, 0u);
  EXPECT_EQ(c.world_size, 1u);
  EXPECT_EQ(c.backend, Backend::kStock);
  EXPECT_EQ(c.run_id.rfind("local-", 0), 0u) << c.run_id;
}

TEST(HookConfig, TorchrunAndSlurmRanks) {
  HookConfig c = load({{"RANK", "3"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}, {"TORCHELASTIC_RUN_ID", "abc"}});
  EXPECT_EQ(c.rank, 3u);
  EXPECT_EQ(c.local_rank, 1u);
  EXPECT_EQ(c.world_size, 8u);
  EXPECT_EQ(c.run_id, "torchrun-abc");
  c = load({{"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS", "16"}, {"SLURM_JOB_ID", "77"},
            {"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(c.rank, 5u);
  EXPECT_EQ(c.world_size, 16u);
  EXPECT_EQ(c.run_id, "slurm-77.0");
  c = load({{"GAUGEWATCH_RANK", "2"}, {"RANK", "9"}, {"WORLD_SIZE", "4"}, {"GAUGEWATCH_RUN_ID", "my run/1"}});
  EXPECT_EQ(c.rank, 2u);
  EXPECT_EQ(c.run_id, "my-run-1");
}

TEST(HookConfig, ParsesSamplingBackendsAndLayers) {
  const HookConfig c = load({{"GAUGEWATCH_SAMPLE_EVERY", "10"}, {"GAUGEWATCH_LAYER_FRACTION", "0.5"},
                             {"GAUGEWATCH_LAYERS", "0, 3,7"}, {"GAUGEWATCH_BACKEND", "gproj"},
                             {"GAUGEWATCH_LAYER_BACKENDS", "1=fp32,2=pivot"}, {"GAUGEWATCH_SOCKET", "none"}});
  EXPECT_EQ(c.every_n_steps, 10u);
  EXPECT_DOUBLE_EQ(c.layer_fraction, 0.5);
  EXPECT_EQ(c.layers, (std::vector<std::uint32_t>{0, 3, 7}));
  EXPECT_EQ(c.backend, Backend::kGproj);
  ASSERT_EQ(c.layer_backends.size(), 2u);
  EXPECT_EQ(c.layer_backends[1], (std::pair<std::uint32_t, Backend>{2, Backend::kPivot}));
  EXPECT_FALSE(c.agent_enabled());
}

TEST(HookConfig, BadValuesKeepDefaultsAndWarn) {
  std::vector<std::string> warnings;
  const HookConfig c = load({{"GAUGEWATCH_SAMPLE_EVERY", "-1"}, {"GAUGEWATCH_LAYER_FRACTION", "2"},
                             {"GAUGEWATCH_BACKEND", "magic"}, {"GAUGEWATCH_LAYER_BACKENDS", "x=gproj"},
                             {"RANK", "4"}, {"WORLD_SIZE", "2"}},
                            &warnings);
  EXPECT_EQ(c.every_n_steps, 100u);
  EXPECT_DOUBLE_EQ(c.layer_fraction, 0.25);
  EXPECT_EQ(c.backend, Backend::kStock);
  EXPECT_TRUE(c.layer_backends.empty());
  EXPECT_EQ(c.world_size, 5u);  // rank must be < world size on the wire
  EXPECT_EQ(warnings.size(), 5u);
}

}  // namespace
}  // namespace gaugewatch::hooks
