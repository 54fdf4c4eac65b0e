// CUPTI kernel timing of sampled backwards (cupti_timing.h).

#include "hooks/cupti_timing.h"

#include <dlfcn.h>
#include <link.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "hooks/log.h"

#if defined(GAUGEWATCH_HOOKS_CUPTI)
#include <cupti.h>
#endif

namespace gaugewatch::hooks::cupti {
namespace {

std::string dir_of(const std::string& path) { return std::filesystem::path(path).parent_path().string(); }

// Directories of the loaded torch CUDA libraries (dl_iterate_phdr: no torch symbol needed).
std::vector<std::string> torch_lib_dirs() {
  std::vector<std::string> dirs;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        for (const char* lib : {"/libtorch_cuda.so", "/libc10_cuda.so"}) {
          const std::size_t n = std::strlen(lib);
          if (name.size() > n && name.compare(name.size() - n, n, lib) == 0) {
            static_cast<std::vector<std::string>*>(out)->push_back(dir_of(name));
          }
        }
        return 0;
      },
      &dirs);
  return dirs;
}

}  // namespace

std::vector<std::string> library_candidates(const std::string& library) {
  if (!library.empty()) return {library};
  // By soname first: torch (libtorch_cpu needs libcupti) has usually loaded one already.
  std::vector<std::string> c = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};
  for (const std::string& dir : torch_lib_dirs()) {
    // site-packages/torch/lib -> site-packages/nvidia/{cu13/lib, cuda_cupti/lib}
    const std::string site = dir + "/../..";
    c.push_back(site + "/nvidia/cu13/lib/libcupti.so.13");
    c.push_back(site + "/nvidia/cuda_cupti/lib/libcupti.so.12");
    c.push_back(site + "/nvidia/cuda_cupti/lib/libcupti.so.13");
  }
  for (const char* dir : {"/usr/local/cuda/extras/CUPTI/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
                          "/usr/local/cuda/lib64", "/usr/local/cuda/lib"}) {
    c.push_back(std::string(dir) + "/libcupti.so");
  }
  return c;
}

#if defined(GAUGEWATCH_HOOKS_CUPTI)
namespace {

struct Api {
  decltype(&cuptiSubscribe) subscribe = nullptr;
  decltype(&cuptiUnsubscribe) unsubscribe = nullptr;
  decltype(&cuptiEnableDomain) enable_domain = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) activity_enable = nullptr;
  decltype(&cuptiActivityDisable) activity_disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

struct Window {
  std::set<std::uint32_t> correlation_ids;
  double kernel_ns = 0.0;
  std::uint64_t kernels = 0;
  bool open = true;
};

struct State {
  std::recursive_mutex mu;  // CUPTI may call back (buffers, API) from inside a call made under it
  bool initialized = false;
  Status status;
  Api api;
  CUpti_SubscriberHandle subscriber = nullptr;
  int open_windows = 0;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, Window> windows;
  std::map<std::uint32_t, std::uint64_t> by_correlation;  // correlation id -> window
  std::uint64_t kernel_records = 0;
  int empty_windows = 0;  // windows in a row that got no kernel record
};

State& state() {
  static auto* s = new State;  // leaked: CUPTI may call back until exit
  return *s;
}

thread_local std::uint64_t t_window = 0;

std::string result_text(const Api& api, CUptiResult r) {
  const char* text = nullptr;
  if (api.result_string != nullptr && api.result_string(r, &text) == CUPTI_SUCCESS && text != nullptr) {
    return std::string(text) + " (" + std::to_string(static_cast<int>(r)) + ")";
  }
  return "CUPTI error " + std::to_string(static_cast<int>(r));
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  if (t_window == 0 || data == nullptr) return;
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  State& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.windows.find(t_window);
  if (it == s.windows.end()) return;
  it->second.correlation_ids.insert(cb->correlationId);
  s.by_correlation[cb->correlationId] = t_window;
}

constexpr std::size_t kBufferBytes = 1 << 20;
constexpr int kFlushWaitMs = 500;  // longest wait for a window's records
constexpr int kMaxEmptyWindows = 3;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  State& s = state();
  CUpti_Activity* record = nullptr;
  {
    std::lock_guard lock(s.mu);
    while (s.api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (record->kind != CUPTI_ACTIVITY_KIND_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
        continue;
      }
      // The fields read here (start, end, correlationId) sit at the same
      // offsets in every CUpti_ActivityKernel version since 4.
      const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      ++s.kernel_records;
      auto it = s.by_correlation.find(kernel->correlationId);
      if (it == s.by_correlation.end()) continue;
      auto w = s.windows.find(it->second);
      if (w != s.windows.end() && kernel->end > kernel->start) {
        w->second.kernel_ns += static_cast<double>(kernel->end - kernel->start);
        ++w->second.kernels;
      }
    }
  }
  std::free(buffer);
}

template <typename F>
bool load_symbol(void* handle, const char* name, F& out, std::string* missing) {
  out = reinterpret_cast<F>(::dlsym(handle, name));
  if (out == nullptr && missing->empty()) *missing = name;
  return out != nullptr;
}

Status init_locked(State& s, const std::string& mode, const std::string& library) {
  Status st;
  if (mode == "events") {
    st.detail = "off (GAUGEWATCH_TIMING=events)";
    return st;
  }
  void* handle = nullptr;
  std::string tried;
  for (const std::string& path : library_candidates(library)) {
    handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      st.library = path;
      break;
    }
    tried += (tried.empty() ? "" : ", ") + path;
  }
  if (handle == nullptr) {
    st.detail = "libcupti not found (tried " + tried.substr(0, 600) + ")";
    return st;
  }
  Api& a = s.api;
  std::string missing;
  load_symbol(handle, "cuptiSubscribe", a.subscribe, &missing);
  load_symbol(handle, "cuptiUnsubscribe", a.unsubscribe, &missing);
  load_symbol(handle, "cuptiEnableDomain", a.enable_domain, &missing);
  load_symbol(handle, "cuptiActivityRegisterCallbacks", a.register_callbacks, &missing);
  load_symbol(handle, "cuptiActivityEnable", a.activity_enable, &missing);
  load_symbol(handle, "cuptiActivityDisable", a.activity_disable, &missing);
  load_symbol(handle, "cuptiActivityFlushAll", a.flush_all, &missing);
  load_symbol(handle, "cuptiActivityGetNextRecord", a.next_record, &missing);
  load_symbol(handle, "cuptiGetResultString", a.result_string, &missing);
  if (!missing.empty()) {
    st.detail = st.library + " has no " + missing;
    return st;
  }
  // Probe the subscription once now: a profiler holding CUPTI shows here.
  CUpti_SubscriberHandle probe = nullptr;
  if (const CUptiResult r = a.subscribe(&probe, &on_api, nullptr); r != CUPTI_SUCCESS) {
    st.detail = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
                    ? "CUPTI is held by another subscriber (a profiler?): " + result_text(a, r)
                    : "cuptiSubscribe failed: " + result_text(a, r);
    return st;
  }
  a.unsubscribe(probe);
  st.usable = true;
  st.detail = "ok";
  return st;
}

}  // namespace

Status init(const std::string& mode, const std::string& library) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.initialized) {
    s.initialized = true;
    s.status = init_locked(s, mode, library);
    log_line(s.status.usable ? "CUPTI kernel timing of sampled CUDA backwards (" + s.status.library + ")"
                             : "CUPTI not used (" + s.status.detail + "): CUDA events time sampled backwards");
  }
  return s.status;
}

Status status() {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.status;
}

std::uint64_t begin_window(std::string* why) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (!s.status.usable || t_window != 0) return 0;
  const Api& a = s.api;
  if (s.open_windows == 0) {
    // Subscribed only while a window is open: a profiler may take CUPTI in between.
    if (const CUptiResult r = a.subscribe(&s.subscriber, &on_api, nullptr); r != CUPTI_SUCCESS) {
      const std::string text = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
                                   ? "CUPTI is held by another subscriber (a profiler?)"
                                   : "cuptiSubscribe failed: " + result_text(a, r);
      log_once("cupti-subscribe", text + ": CUDA events time this sample and any other while it lasts (logged once)");
      if (why != nullptr) *why = text;
      s.subscriber = nullptr;
      return 0;
    }
    // The buffer callbacks are process-wide and torch.profiler (Kineto) sets
    // its own at each session: set ours again for every window.
    CUptiResult r = a.register_callbacks(&buffer_requested, &buffer_completed);
    if (r == CUPTI_SUCCESS) r = a.enable_domain(1, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
    if (r == CUPTI_SUCCESS) r = a.enable_domain(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
    if (r == CUPTI_SUCCESS) r = a.activity_enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS) {
      const std::string text = "enabling CUPTI callbacks / kernel records failed: " + result_text(a, r);
      log_once("cupti-enable", text + ": CUDA events instead (logged once)");
      if (why != nullptr) *why = text;
      a.unsubscribe(s.subscriber);
      s.subscriber = nullptr;
      return 0;
    }
  }
  ++s.open_windows;
  const std::uint64_t id = s.next_id++;
  s.windows.emplace(id, Window{});
  t_window = id;
  return id;
}

void end_window(std::uint64_t id) {
  if (id == 0) return;
  State& s = state();
  std::lock_guard lock(s.mu);
  if (t_window == id) t_window = 0;
  auto it = s.windows.find(id);
  if (it == s.windows.end() || !it->second.open) return;
  it->second.open = false;
  if (--s.open_windows == 0 && s.subscriber != nullptr) {
    // Records of kernels launched while enabled still arrive after this.
    s.api.activity_disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    s.api.unsubscribe(s.subscriber);
    s.subscriber = nullptr;
  }
}

std::optional<double> window_kernel_us(std::uint64_t id) {
  if (id == 0) return std::nullopt;
  State& s = state();
  {
    std::lock_guard lock(s.mu);
    if (!s.status.usable) return std::nullopt;
  }
  // Delivers completed buffers to buffer_completed (on this thread or
  // CUPTI's). The caller waited for the window's kernels to finish, but a
  // buffer comes back only once *all* its records are complete, and it may
  // also hold the kernels of windows opened after this one (the other
  // sampled layers of the step, which the GPU reaches a little later): poll
  // for a bounded time (this is the auditor's queue time, not audit time).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kFlushWaitMs);
  for (;;) {
    s.api.flush_all(0);
    {
      std::lock_guard lock(s.mu);
      auto it = s.windows.find(id);
      if (it == s.windows.end() || it->second.kernels > 0) break;
    }
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::lock_guard lock(s.mu);
  auto it = s.windows.find(id);
  if (it == s.windows.end()) return std::nullopt;
  const Window w = std::move(it->second);
  s.windows.erase(it);
  for (std::uint32_t c : w.correlation_ids) s.by_correlation.erase(c);
  if (w.kernels == 0) {
    // Records that never come (another component took the buffer callbacks
    // and keeps them) would cost every sample the wait: give up on CUPTI.
    if (++s.empty_windows >= kMaxEmptyWindows && s.status.usable) {
      s.status.usable = false;
      s.status.detail = "no kernel records arrived for " + std::to_string(kMaxEmptyWindows) +
                        " sampled backwards in a row";
      log_line("CUPTI: " + s.status.detail + ": CUDA events time sampled backwards from now on");
    }
    return std::nullopt;
  }
  s.empty_windows = 0;
  return w.kernel_ns / 1000.0;
}

void discard_window(std::uint64_t id) {
  if (id == 0) return;
  end_window(id);
  State& s = state();
  std::lock_guard lock(s.mu);
  auto it = s.windows.find(id);
  if (it == s.windows.end()) return;
  for (std::uint32_t c : it->second.correlation_ids) s.by_correlation.erase(c);
  s.windows.erase(it);
}

void reset_for_tests() {
  State& s = state();
  std::lock_guard lock(s.mu);
  s.initialized = false;
  s.status = Status{};
  s.empty_windows = 0;
}

std::uint64_t kernel_records() {
  State& s = state();
  std::lock_guard lock(s.mu);
  return s.kernel_records;
}

#else  // no CUPTI headers at build time: CUDA events only

namespace {
std::mutex g_mu;
Status g_status;
bool g_initialized = false;
}  // namespace

Status init(const std::string& mode, const std::string&) {
  std::lock_guard lock(g_mu);
  if (!g_initialized) {
    g_initialized = true;
    g_status.detail = mode == "events" ? "off (GAUGEWATCH_TIMING=events)" : "built without CUPTI headers";
  }
  return g_status;
}
Status status() {
  std::lock_guard lock(g_mu);
  return g_status;
}
std::uint64_t begin_window(std::string* why) {
  if (why != nullptr) *why = "built without CUPTI headers";
  return 0;
}
void end_window(std::uint64_t) {}
std::optional<double> window_kernel_us(std::uint64_t) { return std::nullopt; }
std::uint64_t kernel_records() { return 0; }
void discard_window(std::uint64_t) {}
void reset_for_tests() {
  std::lock_guard lock(g_mu);
  g_initialized = false;
  g_status = Status{};
}

#endif

}  // namespace gaugewatch::hooks::cupti
