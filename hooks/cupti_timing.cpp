// CUPTI kernel timing of sampled backwards (cupti_timing.h).

#include "hooks/cupti_timing.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
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

// Two locks, never nested the wrong way (docs/hooks.md "Locks and waits"):
//   control  serializes every CUPTI call this file makes (subscribe,
//            enable, disable, unsubscribe, flush) and the subscription. It is
//            never taken by a CUPTI callback, and the training thread only
//            ever tries it for a bounded time (kControlWaitMs).
//   records  a leaf lock: the windows and their kernel records. The CUPTI
//            callbacks (on_api on the training thread inside every CUDA API
//            call, buffer_completed on whichever thread CUPTI delivers a
//            buffer from, possibly while holding CUPTI's own locks) take
//            only this one, and nothing calls CUPTI, logs or waits while
//            holding it.
// Before this, one recursive mutex was held across cuptiSubscribe /
// cuptiActivityEnable / cuptiActivityDisable / cuptiUnsubscribe on the
// training thread while buffer_completed, called by cuptiActivityFlushAll on
// the auditor thread (inside CUPTI's lock), waited for it: a lock-order
// inversion (tests/hooks/cupti_test.cpp, Cupti.FlushNeverDeadlocksWithWindows).
struct State {
  std::timed_mutex control;
  // --- under control ---
  bool initialized = false;
  Api api;
  CUpti_SubscriberHandle subscriber = nullptr;
  // --- under records ---
  std::mutex records;
  Status status;
  int open_windows = 0;
  std::uint64_t next_id = 1;
  std::map<std::uint64_t, Window> windows;
  std::map<std::uint32_t, std::uint64_t> by_correlation;  // correlation id -> window
  std::uint64_t kernel_records = 0;
  int empty_windows = 0;  // windows in a row that got no kernel record
  std::uint64_t busy_skips = 0;
  // --- atomic ---
  std::atomic<bool> stopping{false};  // exit: waits for records end now
};

State& state() {
  static auto* s = new State;  // leaked: CUPTI may call back until exit
  return *s;
}

thread_local std::uint64_t t_window = 0;

constexpr std::size_t kBufferBytes = 1 << 20;
constexpr int kFlushWaitMs = 500;   // longest wait for a window's records (auditor thread)
constexpr int kControlWaitMs = 20;  // longest wait of the training thread for the control lock
constexpr int kMaxEmptyWindows = 3;

std::string result_text(const Api& api, CUptiResult r) {
  const char* text = nullptr;
  if (api.result_string != nullptr && api.result_string(r, &text) == CUPTI_SUCCESS && text != nullptr) {
    return std::string(text) + " (" + std::to_string(static_cast<int>(r)) + ")";
  }
  return "CUPTI error " + std::to_string(static_cast<int>(r));
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  const std::uint64_t window = t_window;
  if (window == 0 || data == nullptr) return;
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API && domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (cb->callbackSite != CUPTI_API_ENTER) return;
  State& s = state();
  std::lock_guard lock(s.records);
  auto it = s.windows.find(window);
  if (it == s.windows.end() || !it->second.open) return;
  it->second.correlation_ids.insert(cb->correlationId);
  s.by_correlation[cb->correlationId] = window;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  State& s = state();
  // Parsed without any lock (cuptiActivityGetNextRecord only reads the
  // buffer); then one short leaf-locked update.
  struct Kernel {
    std::uint32_t correlation;
    std::uint64_t ns;
  };
  std::vector<Kernel> kernels;
  CUpti_Activity* record = nullptr;
  const auto next = s.api.next_record;  // set before any buffer can exist
  while (buffer != nullptr && next != nullptr && next(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_KERNEL && record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      continue;
    }
    // The fields read here (start, end, correlationId) sit at the same
    // offsets in every CUpti_ActivityKernel version since 4.
    const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    kernels.push_back({kernel->correlationId, kernel->end > kernel->start ? kernel->end - kernel->start : 0});
  }
  {
    std::lock_guard lock(s.records);
    s.kernel_records += kernels.size();
    for (const Kernel& k : kernels) {
      auto it = s.by_correlation.find(k.correlation);
      if (it == s.by_correlation.end()) continue;
      auto w = s.windows.find(it->second);
      if (w != s.windows.end() && k.ns > 0) {
        w->second.kernel_ns += static_cast<double>(k.ns);
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

// Under control.
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

// Under control: ends the subscription once no window is open (CUPTI calls
// made without the records lock).
void close_if_idle_locked(State& s) {
  if (s.subscriber == nullptr) return;
  {
    std::lock_guard lock(s.records);
    if (s.open_windows > 0) return;
  }
  // Records of kernels launched while enabled still arrive after this.
  s.api.activity_disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  s.api.unsubscribe(s.subscriber);
  s.subscriber = nullptr;
}

bool usable(State& s) {
  std::lock_guard lock(s.records);
  return s.status.usable;
}

}  // namespace

Status init(const std::string& mode, const std::string& library) {
  State& s = state();
  std::string line;
  Status st;
  {
    std::lock_guard control(s.control);
    if (!s.initialized) {
      s.initialized = true;
      st = init_locked(s, mode, library);
      {
        std::lock_guard lock(s.records);
        s.status = st;
      }
      line = st.usable ? "CUPTI kernel timing of sampled CUDA backwards (" + st.library + ")"
                       : "CUPTI not used (" + st.detail + "): CUDA events time sampled backwards";
    }
  }
  if (!line.empty()) log_line(line);
  return status();
}

Status status() {
  State& s = state();
  std::lock_guard lock(s.records);
  return s.status;
}

std::uint64_t begin_window(std::string* why) {
  State& s = state();
  if (t_window != 0 || s.stopping.load() || !usable(s)) return 0;
  // Bounded: the training thread never waits long for the auditor's flush.
  std::unique_lock control(s.control, std::defer_lock);
  if (!control.try_lock_for(std::chrono::milliseconds(kControlWaitMs))) {
    {
      std::lock_guard lock(s.records);
      ++s.busy_skips;
    }
    log_once("cupti-busy", "CUPTI busy (a flush held it over " + std::to_string(kControlWaitMs) +
                               " ms): CUDA events time this sample (logged once; stats timing.cupti_busy_skips)");
    if (why != nullptr) *why = "CUPTI busy";
    return 0;
  }
  const Api& a = s.api;
  if (s.subscriber == nullptr) {
    // Subscribed only while windows are open: a profiler may take CUPTI in between.
    if (const CUptiResult r = a.subscribe(&s.subscriber, &on_api, nullptr); r != CUPTI_SUCCESS) {
      s.subscriber = nullptr;
      control.unlock();
      const std::string text = r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
                                   ? "CUPTI is held by another subscriber (a profiler?)"
                                   : "cuptiSubscribe failed: " + result_text(a, r);
      log_once("cupti-subscribe", text + ": CUDA events time this sample and any other while it lasts (logged once)");
      if (why != nullptr) *why = text;
      return 0;
    }
    // The buffer callbacks are process-wide and torch.profiler (Kineto) sets
    // its own at each session: set ours again for every subscription.
    CUptiResult r = a.register_callbacks(&buffer_requested, &buffer_completed);
    if (r == CUPTI_SUCCESS) r = a.enable_domain(1, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
    if (r == CUPTI_SUCCESS) r = a.enable_domain(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
    if (r == CUPTI_SUCCESS) r = a.activity_enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS) {
      a.unsubscribe(s.subscriber);
      s.subscriber = nullptr;
      control.unlock();
      const std::string text = "enabling CUPTI callbacks / kernel records failed: " + result_text(a, r);
      log_once("cupti-enable", text + ": CUDA events instead (logged once)");
      if (why != nullptr) *why = text;
      return 0;
    }
  }
  std::uint64_t id = 0;
  {
    std::lock_guard lock(s.records);
    ++s.open_windows;
    id = s.next_id++;
    s.windows.emplace(id, Window{});
  }
  t_window = id;
  return id;
}

void end_window(std::uint64_t id) {
  if (id == 0) return;
  if (t_window == id) t_window = 0;  // this thread's API calls are no longer noted
  State& s = state();
  {
    std::lock_guard lock(s.records);
    auto it = s.windows.find(id);
    if (it == s.windows.end() || !it->second.open) return;
    it->second.open = false;
    --s.open_windows;
  }
  // Unsubscribing needs the control lock: if a flush holds it, the flusher
  // (window_kernel_us) or the next window ends the idle subscription instead.
  std::unique_lock control(s.control, std::defer_lock);
  if (control.try_lock_for(std::chrono::milliseconds(kControlWaitMs))) close_if_idle_locked(s);
}

std::optional<double> window_kernel_us(std::uint64_t id) {
  if (id == 0) return std::nullopt;
  State& s = state();
  if (!usable(s)) return std::nullopt;
  // Delivers completed buffers to buffer_completed (on this thread or
  // CUPTI's). The caller waited for the window's kernels to finish, but a
  // buffer comes back only once *all* its records are complete, and it may
  // also hold the kernels of windows opened after this one (the other
  // sampled layers of the step, which the GPU reaches a little later): poll
  // for a bounded time (this is the auditor's queue time, not audit time).
  // The control lock is held for one flush at a time, never while sleeping.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kFlushWaitMs);
  for (;;) {
    {
      std::unique_lock control(s.control, std::defer_lock);
      if (control.try_lock_for(std::chrono::milliseconds(kControlWaitMs))) {
        s.api.flush_all(0);
        close_if_idle_locked(s);  // a window closed while a flush held the lock
      }
    }
    {
      std::lock_guard lock(s.records);
      auto it = s.windows.find(id);
      if (it == s.windows.end() || it->second.kernels > 0) break;
    }
    if (s.stopping.load() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::string give_up;
  std::optional<double> us;
  {
    std::lock_guard lock(s.records);
    auto it = s.windows.find(id);
    if (it == s.windows.end()) return std::nullopt;
    const Window w = std::move(it->second);
    if (w.open) --s.open_windows;  // (never: the window closes before its audit is queued)
    s.windows.erase(it);
    for (std::uint32_t c : w.correlation_ids) s.by_correlation.erase(c);
    if (w.kernels == 0) {
      // Records that never come (another component took the buffer callbacks
      // and keeps them) would cost every sample the wait: give up on CUPTI.
      // (Not while exiting: the wait was cut short, not empty.)
      if (!s.stopping.load() && ++s.empty_windows >= kMaxEmptyWindows && s.status.usable) {
        s.status.usable = false;
        s.status.detail = "no kernel records arrived for " + std::to_string(kMaxEmptyWindows) +
                          " sampled backwards in a row";
        give_up = s.status.detail;
      }
    } else {
      s.empty_windows = 0;
      us = w.kernel_ns / 1000.0;
    }
  }
  if (!give_up.empty()) log_line("CUPTI: " + give_up + ": CUDA events time sampled backwards from now on");
  return us;
}

void discard_window(std::uint64_t id) {
  if (id == 0) return;
  end_window(id);
  State& s = state();
  std::lock_guard lock(s.records);
  auto it = s.windows.find(id);
  if (it == s.windows.end()) return;
  for (std::uint32_t c : it->second.correlation_ids) s.by_correlation.erase(c);
  s.windows.erase(it);
}

void stop(double timeout_s) {
  State& s = state();
  s.stopping = true;
  std::unique_lock control(s.control, std::defer_lock);
  if (!control.try_lock_for(std::chrono::duration<double>(timeout_s))) return;
  if (s.subscriber != nullptr) {
    s.api.activity_disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    s.api.unsubscribe(s.subscriber);
    s.subscriber = nullptr;
  }
}

void reset_for_tests() {
  State& s = state();
  std::lock_guard control(s.control);
  if (s.subscriber != nullptr && s.api.unsubscribe != nullptr) {
    s.api.activity_disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    s.api.unsubscribe(s.subscriber);
  }
  s.subscriber = nullptr;
  s.initialized = false;
  s.stopping = false;
  std::lock_guard lock(s.records);
  s.status = Status{};
  s.empty_windows = 0;
  s.open_windows = 0;
  s.busy_skips = 0;
  s.windows.clear();
  s.by_correlation.clear();
}

std::uint64_t kernel_records() {
  State& s = state();
  std::lock_guard lock(s.records);
  return s.kernel_records;
}

std::uint64_t busy_skips() {
  State& s = state();
  std::lock_guard lock(s.records);
  return s.busy_skips;
}

bool subscribed() {
  State& s = state();
  std::unique_lock control(s.control, std::defer_lock);
  if (!control.try_lock_for(std::chrono::milliseconds(1000))) return true;
  return s.subscriber != nullptr;
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
std::uint64_t busy_skips() { return 0; }
bool subscribed() { return false; }
void discard_window(std::uint64_t) {}
void stop(double) {}
void reset_for_tests() {
  std::lock_guard lock(g_mu);
  g_initialized = false;
  g_status = Status{};
}

#endif

}  // namespace gaugewatch::hooks::cupti
