// A stand-in libcupti for tests/hooks/cupti_test.cpp (no GPU needed): the
// nine entry points hooks/cupti_timing.cpp loads, with CUPTI's locking
// behaviour where it matters for deadlocks: one internal lock taken by every
// call, and completed buffers delivered to the client's callback *while that
// lock is held* (by cuptiActivityFlushAll on the calling thread, and by an
// optional worker thread, as CUPTI's own delivery thread does). Test
// controls: fake_cupti_* below ("a CUDA API call launching one kernel of N
// ns", a delay inside the flush, the worker).

#include <cupti.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace {

std::mutex g_lock;  // CUPTI's internal lock
bool g_subscribed = false;
CUpti_CallbackFunc g_callback = nullptr;
void* g_userdata = nullptr;
bool g_runtime_domain = false;
bool g_kernels = false;
CUpti_BuffersCallbackRequestFunc g_request = nullptr;
CUpti_BuffersCallbackCompleteFunc g_complete = nullptr;
std::vector<CUpti_ActivityKernel10> g_pending;  // records not yet delivered
std::atomic<std::uint32_t> g_correlation{1};
std::atomic<int> g_flush_delay_us{0};
std::atomic<bool> g_worker_run{false};
std::thread g_worker;

// Under g_lock, as CUPTI delivers.
void deliver_locked() {
  if (g_pending.empty() || g_request == nullptr || g_complete == nullptr) return;
  std::uint8_t* buffer = nullptr;
  size_t size = 0, max_records = 0;
  g_request(&buffer, &size, &max_records);
  if (buffer == nullptr) return;
  const size_t n = std::min(g_pending.size(), size / sizeof(CUpti_ActivityKernel10));
  std::memcpy(buffer, g_pending.data(), n * sizeof(CUpti_ActivityKernel10));
  g_pending.erase(g_pending.begin(), g_pending.begin() + static_cast<std::ptrdiff_t>(n));
  g_complete(nullptr, 0, buffer, size, n * sizeof(CUpti_ActivityKernel10));
}

}  // namespace

extern "C" {

CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback, void* userdata) {
  std::lock_guard lock(g_lock);
  if (g_subscribed) return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
  g_subscribed = true;
  g_callback = callback;
  g_userdata = userdata;
  *subscriber = reinterpret_cast<CUpti_SubscriberHandle>(&g_subscribed);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle) {
  std::lock_guard lock(g_lock);
  g_subscribed = false;
  g_callback = nullptr;
  g_runtime_domain = false;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle, CUpti_CallbackDomain domain) {
  std::lock_guard lock(g_lock);
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) g_runtime_domain = enable != 0;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc request,
                                           CUpti_BuffersCallbackCompleteFunc complete) {
  std::lock_guard lock(g_lock);
  g_request = request;
  g_complete = complete;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind) {
  std::lock_guard lock(g_lock);
  if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) g_kernels = true;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind) {
  std::lock_guard lock(g_lock);
  if (kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) g_kernels = false;
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityFlushAll(uint32_t) {
  std::lock_guard lock(g_lock);
  if (const int us = g_flush_delay_us.load(); us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  deliver_locked();
  return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t* buffer, size_t valid, CUpti_Activity** record) {
  std::uint8_t* next = *record == nullptr ? buffer
                                          : reinterpret_cast<std::uint8_t*>(*record) + sizeof(CUpti_ActivityKernel10);
  if (next + sizeof(CUpti_ActivityKernel10) > buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
  *record = reinterpret_cast<CUpti_Activity*>(next);
  return CUPTI_SUCCESS;
}

CUptiResult cuptiGetResultString(CUptiResult, const char** text) {
  *text = "fake CUPTI result";
  return CUPTI_SUCCESS;
}

// --- test controls ---------------------------------------------------------------

// One CUDA API call on the calling thread that launches one kernel of `ns`
// nanoseconds: the API callback (enter), then, with kernel records enabled,
// its record (delivered by the next flush or the worker).
void fake_cupti_api_call(std::uint64_t ns) {
  CUpti_CallbackFunc callback = nullptr;
  void* userdata = nullptr;
  bool kernels = false;
  {
    std::lock_guard lock(g_lock);
    if (g_subscribed && g_runtime_domain) callback = g_callback;
    userdata = g_userdata;
    kernels = g_kernels;
  }
  const std::uint32_t correlation = g_correlation.fetch_add(1);
  if (callback != nullptr) {
    CUpti_CallbackData data{};
    data.callbackSite = CUPTI_API_ENTER;
    data.correlationId = correlation;
    callback(userdata, CUPTI_CB_DOMAIN_RUNTIME_API, 0, &data);
  }
  if (kernels) {
    CUpti_ActivityKernel10 k{};
    k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    k.start = 1000;
    k.end = 1000 + ns;
    k.correlationId = correlation;
    std::lock_guard lock(g_lock);
    g_pending.push_back(k);
  }
}

void fake_cupti_set_flush_delay_us(int us) { g_flush_delay_us = us; }

bool fake_cupti_subscribed() {
  std::lock_guard lock(g_lock);
  return g_subscribed;
}

// A CUPTI-owned thread delivering completed buffers every `period_us`, under the internal lock.
void fake_cupti_start_worker(int period_us) {
  if (g_worker_run.exchange(true)) return;
  g_worker = std::thread([period_us] {
    while (g_worker_run.load()) {
      {
        std::lock_guard lock(g_lock);
        deliver_locked();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(period_us));
    }
  });
}

void fake_cupti_stop_worker() {
  if (!g_worker_run.exchange(false)) return;
  if (g_worker.joinable()) g_worker.join();
}

void fake_cupti_reset() {
  fake_cupti_stop_worker();
  std::lock_guard lock(g_lock);
  g_subscribed = false;
  g_callback = nullptr;
  g_runtime_domain = false;
  g_kernels = false;
  g_pending.clear();
  g_flush_delay_us = 0;
}

}  // extern "C"
