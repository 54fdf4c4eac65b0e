#pragma once
// Configuration of libgaugewatch_hooks, read once from GAUGEWATCH_* environment
// variables (docs/hooks.md lists them). A bad value is logged once and the
// default kept: configuration never stops a trainer.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/common/backend.h"

namespace gaugewatch::hooks {

inline constexpr const char* kDefaultSocket = "/run/gaugewatch/agent.sock";  // the agent's default

struct HookConfig {
  bool disabled = false;                 // GAUGEWATCH_DISABLE=1: stay inert
  std::string socket = kDefaultSocket;   // GAUGEWATCH_SOCKET; "" or "none": no agent
  // GAUGEWATCH_RUN_ID, else torchrun's rendezvous id, else the Slurm job
  // (step), else GAUGEWATCH_LAUNCH_ID (`gaugewatch run` sets one per launch),
  // else this process: local-<host>-<start time>-<pid>. Unique per launch
  // unless given: another run's decisions are restored only on purpose.
  std::string run_id;
  std::string run_id_source;             // "GAUGEWATCH_RUN_ID", "torchrun", "slurm", "launcher", "process"
  std::uint32_t rank = 0;                // GAUGEWATCH_RANK, RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK
  std::uint32_t local_rank = 0;          // LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK
  std::uint32_t world_size = 1;          // WORLD_SIZE, SLURM_NTASKS, OMPI_COMM_WORLD_SIZE
  std::uint32_t every_n_steps = 100;     // GAUGEWATCH_SAMPLE_EVERY (0: never sample)
  double layer_fraction = 0.25;          // GAUGEWATCH_LAYER_FRACTION, (0, 1]
  std::vector<std::uint32_t> layers;     // GAUGEWATCH_LAYERS "0,3,7": audit only these
  std::uint32_t max_heads = 1;           // GAUGEWATCH_MAX_HEADS: (batch, head) slices per audit
  std::uint32_t max_rows = 128;          // GAUGEWATCH_MAX_ROWS: query rows per slice
  double overhead_budget = 0.02;         // GAUGEWATCH_OVERHEAD_BUDGET: audit time / step time
  Backend backend = Backend::kStock;     // GAUGEWATCH_BACKEND: initial backend of every layer
  std::vector<std::pair<std::uint32_t, Backend>> layer_backends;  // GAUGEWATCH_LAYER_BACKENDS "1=gproj,2=fp32"
  std::string capture_dir;               // GAUGEWATCH_CAPTURE_DIR; "": captures are rejected
  std::uint64_t capture_max_bytes = 1ull << 30;  // GAUGEWATCH_CAPTURE_MAX_BYTES, all files together
  std::uint64_t audit_max_bytes = 256ull << 20;  // GAUGEWATCH_AUDIT_MAX_BYTES: memory of one audit's copies (side stream + host)
  std::uint32_t grad_accum = 1;          // GAUGEWATCH_GRAD_ACCUM: backward passes per step until an optimizer step is signalled
  // GAUGEWATCH_TIMING: events (default) | cupti (CUPTI where usable, else CUDA
  // events; "auto" is the same). CUPTI is opt-in: once used it slows every
  // later kernel launch of the process (docs/hooks.md, "Kernel timing").
  std::string timing = "events";
  std::string cupti_lib;                 // GAUGEWATCH_CUPTI_LIB: libcupti.so to dlopen (else searched)
  std::uint32_t queue_size = 1024;       // GAUGEWATCH_QUEUE_SIZE: samples waiting for the agent
  std::uint32_t reconnect_max_ms = 5000; // GAUGEWATCH_RECONNECT_MAX_MS: backoff ceiling
  std::string log_file;                  // GAUGEWATCH_LOG_FILE: copy of the log lines
  std::string stats_file;                // GAUGEWATCH_STATS_FILE: stats JSON rewritten every step
  std::string host;                      // gethostname()
  std::uint32_t pid = 0;

  bool agent_enabled() const { return !socket.empty() && socket != "none"; }
};

using EnvLookup = std::function<const char*(const char*)>;

// Reads the configuration; `env` returns nullptr for unset variables
// (std::getenv in the library, a map in tests). Problems are appended to
// `warnings` (the library logs them once).
HookConfig load_config(const EnvLookup& env, std::vector<std::string>* warnings);

// "" when GAUGEWATCH_LOG_FILE / GAUGEWATCH_STATS_FILE at `path` can be
// written (the log appended to; the stats file's temporary created next to
// it and renamed over it), else what is wrong. An empty path is fine.
std::string check_log_file(const std::string& path);
std::string check_stats_file(const std::string& path);

// "<host>-<UTC start time>-<pid>": a run id part unique per launch.
std::string unique_launch_suffix(const std::string& host, std::uint32_t pid);

// Keeps [A-Za-z0-9_.:-], replaces anything else by '-', at most 128 chars.
std::string sanitize_run_id(const std::string& text);

}  // namespace gaugewatch::hooks
