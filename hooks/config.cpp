#include "hooks/config.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace gaugewatch::hooks {
namespace {

const char* first_set(const EnvLookup& env, std::initializer_list<const char*> names) {
  for (const char* name : names) {
    const char* value = env(name);
    if (value != nullptr && *value != '\0') return value;
  }
  return nullptr;
}

std::optional<std::uint64_t> parse_uint(const std::string& text, std::uint64_t max) {
  if (text.empty() || text.size() > 20) return std::nullopt;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno != 0 || v > max) return std::nullopt;
  return v;
}

std::optional<double> parse_fraction(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v <= 0.0 || v > 1.0) {
    return std::nullopt;
  }
  return v;
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  for (char c : text) {
    if (c == sep) {
      parts.push_back(part);
      part.clear();
    } else if (c != ' ') {
      part.push_back(c);
    }
  }
  parts.push_back(part);
  return parts;
}

template <typename T>
void read_uint(const EnvLookup& env, const char* name, T& out, std::uint64_t max,
               std::vector<std::string>* warnings) {
  const char* value = env(name);
  if (value == nullptr || *value == '\0') return;
  if (auto v = parse_uint(value, max)) {
    out = static_cast<T>(*v);
  } else if (warnings != nullptr) {
    warnings->push_back(std::string(name) + "='" + value + "' is not an integer in [0, " +
                        std::to_string(max) + "]; using " + std::to_string(out));
  }
}

void read_fraction(const EnvLookup& env, const char* name, double& out, std::vector<std::string>* warnings) {
  const char* value = env(name);
  if (value == nullptr || *value == '\0') return;
  if (auto v = parse_fraction(value)) {
    out = *v;
  } else if (warnings != nullptr) {
    warnings->push_back(std::string(name) + "='" + value + "' is not a number in (0, 1]; using " +
                        std::to_string(out));
  }
}

// A backend a layer can run (the backend table's `layer` rows).
std::optional<Backend> parse_layer_backend(std::string_view name) {
  const auto b = parse_backend(name);
  if (!b || !backend_spec(*b).layer) return std::nullopt;
  return b;
}

std::string layer_backend_names() {
  return backend_names([](const BackendSpec& s) { return s.layer; });
}

}  // namespace

std::string unique_launch_suffix(const std::string& host, std::uint32_t pid) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char stamp[32] = {};
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &utc);
  return host + "-" + stamp + "-" + std::to_string(pid);
}

std::string sanitize_run_id(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == ':' || c == '-';
    out.push_back(ok ? c : '-');
    if (out.size() == 128) break;
  }
  return out;
}

std::string check_log_file(const std::string& path) {
  if (path.empty()) return "";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "GAUGEWATCH_LOG_FILE=" + path + " is a directory";
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return "GAUGEWATCH_LOG_FILE=" + path + " cannot be written (" + std::strerror(errno) + ")";
  std::fclose(f);
  return "";
}

// "" when the stats file can be written (its temporary next to it, renamed
// over it: the directory must take new files); else what is wrong.
std::string check_stats_file(const std::string& path) {
  if (path.empty()) return "";
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return "GAUGEWATCH_STATS_FILE=" + path + " is a directory";
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "a");
  if (f == nullptr) {
    return "GAUGEWATCH_STATS_FILE=" + path + " cannot be written (" + std::strerror(errno) + ")";
  }
  std::fclose(f);
  std::remove(tmp.c_str());
  return "";
}

HookConfig load_config(const EnvLookup& env, std::vector<std::string>* warnings) {
  HookConfig c;
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) == 0) c.host = host;
  c.pid = static_cast<std::uint32_t>(::getpid());

  if (const char* v = env("GAUGEWATCH_DISABLE"); v != nullptr && std::string_view(v) != "" &&
                                                   std::string_view(v) != "0") {
    c.disabled = true;
  }
  if (const char* v = env("GAUGEWATCH_SOCKET"); v != nullptr) c.socket = v;

  // Rank and world size: explicit, then torchrun, then Slurm, then Open MPI.
  if (const char* v = first_set(env, {"GAUGEWATCH_RANK", "RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"})) {
    if (auto r = parse_uint(v, 1u << 30)) c.rank = static_cast<std::uint32_t>(*r);
  }
  if (const char* v = first_set(env, {"GAUGEWATCH_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID",
                                      "OMPI_COMM_WORLD_LOCAL_RANK"})) {
    if (auto r = parse_uint(v, 1u << 30)) c.local_rank = static_cast<std::uint32_t>(*r);
  }
  if (const char* v = first_set(env, {"GAUGEWATCH_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS",
                                      "OMPI_COMM_WORLD_SIZE"})) {
    if (auto r = parse_uint(v, 1u << 30); r && *r > 0) c.world_size = static_cast<std::uint32_t>(*r);
  }
  if (c.rank >= c.world_size) {
    if (warnings != nullptr) {
      warnings->push_back("rank " + std::to_string(c.rank) + " >= world size " + std::to_string(c.world_size) +
                          "; reporting world size " + std::to_string(c.rank + 1));
    }
    c.world_size = c.rank + 1;
  }
  if (c.local_rank >= c.world_size) c.local_rank = 0;

  // Run id (config.h): explicit, then torchrun's rendezvous id, then the
  // Slurm job, then the launch, then this process.
  if (const char* v = env("GAUGEWATCH_RUN_ID"); v != nullptr && *v != '\0') {
    c.run_id = v;
    c.run_id_source = "GAUGEWATCH_RUN_ID";
  } else if (const char* t = env("TORCHELASTIC_RUN_ID"); t != nullptr && *t != '\0' &&
                                                         std::string_view(t) != "none") {
    c.run_id = std::string("torchrun-") + t;
    c.run_id_source = "torchrun";
  } else if (const char* s = env("SLURM_JOB_ID"); s != nullptr && *s != '\0') {
    c.run_id = std::string("slurm-") + s;
    if (const char* step = env("SLURM_STEP_ID"); step != nullptr && *step != '\0') c.run_id += std::string(".") + step;
    c.run_id_source = "slurm";
  } else if (const char* l = env("GAUGEWATCH_LAUNCH_ID"); l != nullptr && *l != '\0') {
    c.run_id = l;
    c.run_id_source = "launcher";
  } else {
    c.run_id = "local-" + unique_launch_suffix(c.host, c.pid);
    c.run_id_source = "process";
  }
  const std::string clean = sanitize_run_id(c.run_id);
  if (clean != c.run_id && warnings != nullptr) {
    warnings->push_back("run id '" + c.run_id + "' sanitized to '" + clean + "'");
  }
  c.run_id = clean.empty() ? "local" : clean;

  read_uint(env, "GAUGEWATCH_SAMPLE_EVERY", c.every_n_steps, 1'000'000'000, warnings);
  read_fraction(env, "GAUGEWATCH_LAYER_FRACTION", c.layer_fraction, warnings);
  read_uint(env, "GAUGEWATCH_MAX_HEADS", c.max_heads, 1u << 16, warnings);
  read_uint(env, "GAUGEWATCH_MAX_ROWS", c.max_rows, 1u << 24, warnings);
  if (c.max_heads == 0) c.max_heads = 1;
  if (c.max_rows == 0) c.max_rows = 1;
  read_fraction(env, "GAUGEWATCH_OVERHEAD_BUDGET", c.overhead_budget, warnings);
  read_uint(env, "GAUGEWATCH_CAPTURE_MAX_BYTES", c.capture_max_bytes, ~0ull >> 1, warnings);
  read_uint(env, "GAUGEWATCH_AUDIT_MAX_BYTES", c.audit_max_bytes, ~0ull >> 1, warnings);
  read_uint(env, "GAUGEWATCH_GRAD_ACCUM", c.grad_accum, 1u << 20, warnings);
  if (c.grad_accum == 0) c.grad_accum = 1;
  read_uint(env, "GAUGEWATCH_QUEUE_SIZE", c.queue_size, 1u << 20, warnings);
  if (c.queue_size == 0) c.queue_size = 1;
  read_uint(env, "GAUGEWATCH_RECONNECT_MAX_MS", c.reconnect_max_ms, 3'600'000, warnings);
  if (c.reconnect_max_ms < 10) c.reconnect_max_ms = 10;

  if (const char* v = env("GAUGEWATCH_LAYERS"); v != nullptr && *v != '\0') {
    for (const std::string& part : split(v, ',')) {
      if (part.empty()) continue;
      if (auto layer = parse_uint(part, 1u << 20)) {
        c.layers.push_back(static_cast<std::uint32_t>(*layer));
      } else if (warnings != nullptr) {
        warnings->push_back("GAUGEWATCH_LAYERS: '" + part + "' is not a layer index; ignored");
      }
    }
  }
  if (const char* v = env("GAUGEWATCH_BACKEND"); v != nullptr && *v != '\0') {
    if (auto b = parse_layer_backend(v)) {
      c.backend = *b;
    } else if (warnings != nullptr) {
      warnings->push_back(std::string("GAUGEWATCH_BACKEND='") + v + "' is not " + layer_backend_names() +
                          "; using stock");
    }
  }
  if (const char* v = env("GAUGEWATCH_LAYER_BACKENDS"); v != nullptr && *v != '\0') {
    for (const std::string& part : split(v, ',')) {
      if (part.empty()) continue;
      const auto eq = part.find('=');
      std::optional<std::uint64_t> layer;
      std::optional<Backend> backend;
      if (eq != std::string::npos) {
        layer = parse_uint(part.substr(0, eq), 1u << 20);
        backend = parse_layer_backend(part.substr(eq + 1));
      }
      if (layer && backend) {
        c.layer_backends.emplace_back(static_cast<std::uint32_t>(*layer), *backend);
      } else if (warnings != nullptr) {
        warnings->push_back("GAUGEWATCH_LAYER_BACKENDS: '" + part + "' is not <layer>=<backend>; ignored");
      }
    }
  }
  if (const char* v = env("GAUGEWATCH_TIMING"); v != nullptr && *v != '\0') {
    if (std::string_view(v) == "events") {
      c.timing = "events";
    } else if (std::string_view(v) == "cupti" || std::string_view(v) == "auto") {
      c.timing = "cupti";
    } else if (warnings != nullptr) {
      warnings->push_back(std::string("GAUGEWATCH_TIMING='") + v + "' is not events|cupti; using events");
    }
  }
  if (const char* v = env("GAUGEWATCH_CUPTI_LIB"); v != nullptr) c.cupti_lib = v;
  if (const char* v = env("GAUGEWATCH_CAPTURE_DIR"); v != nullptr) c.capture_dir = v;
  if (const char* v = env("GAUGEWATCH_LOG_FILE"); v != nullptr) c.log_file = v;
  if (const char* v = env("GAUGEWATCH_STATS_FILE"); v != nullptr) c.stats_file = v;
  return c;
}

}  // namespace gaugewatch::hooks
