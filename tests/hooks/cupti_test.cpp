// CUPTI kernel timing (hooks/cupti_timing.h): every way CUPTI can be
// unusable falls back to CUDA events with its reason, on a machine without
// a GPU. The real libcupti of the torch wheel is loaded when it is there
// (GAUGEWATCH_TEST_CUPTI_LIB): without a driver its cuptiSubscribe fails,
// which is the fallback taken when no GPU / a broken driver is present. The
// path with a GPU is tests/python/test_hooks_gpu.py (CUPTI source, and a
// second subscriber holding CUPTI).
//
// The windows' locking is tested against a stand-in libcupti
// (fake_cupti.cpp: CUPTI's internal lock, buffers delivered under it by the
// flush and by a worker thread): a training thread opening and closing
// windows while an auditor thread flushes never deadlocks; overlapping
// windows (two threads, or a micro-batch's window opened before the
// previous one was read) keep their own kernels; a flush holding the lock
// never stalls the training thread beyond 20 ms; stop() ends the waits.

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "hooks/cupti_timing.h"

namespace gaugewatch::hooks::cupti {
namespace {

bool has_cuda_driver() {
  void* h = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (h != nullptr) ::dlclose(h);
  return h != nullptr;
}

TEST(Cupti, EventsModeNeverLoadsIt) {
  reset_for_tests();
  const Status st = init("events", "");
  EXPECT_FALSE(st.usable);
  EXPECT_NE(st.detail.find("GAUGEWATCH_TIMING=events"), std::string::npos) << st.detail;
  std::string why;
  EXPECT_EQ(begin_window(&why), 0u);
  EXPECT_FALSE(window_kernel_us(0).has_value());
  // Decided once: a later call returns the same.
  EXPECT_EQ(init("auto", "").detail, st.detail);
}

TEST(Cupti, MissingLibraryFallsBackToEvents) {
  reset_for_tests();
  const Status st = init("auto", "/nonexistent/libcupti.so");
  EXPECT_FALSE(st.usable);
  EXPECT_NE(st.detail.find("libcupti not found"), std::string::npos) << st.detail;
  EXPECT_NE(st.detail.find("/nonexistent/libcupti.so"), std::string::npos) << st.detail;
  EXPECT_EQ(begin_window(), 0u);
}

TEST(Cupti, LibraryWithoutCuptiFallsBackToEvents) {
  reset_for_tests();
  const Status st = init("auto", "libc.so.6");
  EXPECT_FALSE(st.usable);
  EXPECT_NE(st.detail.find("has no cuptiSubscribe"), std::string::npos) << st.detail;
}

TEST(Cupti, RealLibcupti) {
#if !defined(GAUGEWATCH_HOOKS_CUPTI)
  GTEST_SKIP() << "built without CUPTI headers";
#else
  const std::string lib = GAUGEWATCH_TEST_CUPTI_LIB;
  if (lib.empty() || !std::filesystem::exists(lib)) GTEST_SKIP() << "no libcupti in the torch wheel";
  reset_for_tests();
  const Status st = init("auto", lib);
  EXPECT_EQ(st.library, lib);
  if (!has_cuda_driver()) {
    // No GPU here: CUPTI refuses the subscription; events (which need a GPU
    // too) are what a CUDA sample would then use.
    EXPECT_FALSE(st.usable);
    EXPECT_NE(st.detail.find("cuptiSubscribe failed"), std::string::npos) << st.detail;
    std::string why;
    EXPECT_EQ(begin_window(&why), 0u);
  } else {
    // A driver: windows open and close; with no kernel launched, no time.
    ASSERT_TRUE(st.usable) << st.detail;
    const std::uint64_t w = begin_window();
    ASSERT_NE(w, 0u);
    end_window(w);
    EXPECT_FALSE(window_kernel_us(w).has_value());
  }
#endif
}

TEST(Cupti, CandidatesCoverTheToolkitAndTheOverride) {
  EXPECT_EQ(library_candidates("/x/libcupti.so"), std::vector<std::string>{"/x/libcupti.so"});
  const auto c = library_candidates("");
  for (const char* want : {"libcupti.so.13", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
                           "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so"}) {
    EXPECT_NE(std::find(c.begin(), c.end(), want), c.end()) << want;
  }
}


// --- the stand-in libcupti ----------------------------------------------------------
#if defined(GAUGEWATCH_HOOKS_CUPTI) && defined(GAUGEWATCH_TEST_FAKE_CUPTI)
struct Fake {
  void* handle = nullptr;
  void (*api_call)(std::uint64_t) = nullptr;
  void (*flush_delay_us)(int) = nullptr;
  bool (*subscribed)() = nullptr;
  void (*start_worker)(int) = nullptr;
  void (*stop_worker)() = nullptr;
  void (*reset)() = nullptr;

  Fake() {
    handle = ::dlopen(GAUGEWATCH_TEST_FAKE_CUPTI, RTLD_NOW | RTLD_LOCAL);  // the same object init() opens
    if (handle == nullptr) return;
    api_call = reinterpret_cast<void (*)(std::uint64_t)>(::dlsym(handle, "fake_cupti_api_call"));
    flush_delay_us = reinterpret_cast<void (*)(int)>(::dlsym(handle, "fake_cupti_set_flush_delay_us"));
    subscribed = reinterpret_cast<bool (*)()>(::dlsym(handle, "fake_cupti_subscribed"));
    start_worker = reinterpret_cast<void (*)(int)>(::dlsym(handle, "fake_cupti_start_worker"));
    stop_worker = reinterpret_cast<void (*)()>(::dlsym(handle, "fake_cupti_stop_worker"));
    reset = reinterpret_cast<void (*)()>(::dlsym(handle, "fake_cupti_reset"));
  }
};

Fake& fake() {
  static Fake f;
  return f;
}

// A fresh decision on the stand-in library; skips when it was not built.
#define USE_FAKE_CUPTI()                                                         \
  do {                                                                           \
    if (fake().handle == nullptr) GTEST_SKIP() << "stand-in libcupti missing";   \
    reset_for_tests();                                                           \
    fake().reset();                                                              \
    const Status st = init("auto", GAUGEWATCH_TEST_FAKE_CUPTI);                  \
    ASSERT_TRUE(st.usable) << st.detail;                                         \
  } while (0)

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Runs `f` on a thread; a deadlock (not done within `seconds`) ends the test
// binary at once with a message (the deadlocked threads cannot be joined).
template <typename F>
void within(double seconds, const char* what, F f) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> finished = done->get_future();
  std::thread([f, done]() mutable {
    f();
    done->set_value();
  }).detach();
  if (finished.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    std::fprintf(stderr, "DEADLOCK: %s did not finish within %.0f s\n", what, seconds);
    std::fflush(stderr);
    std::_Exit(3);
  }
}

TEST(CuptiLocking, FlushNeverDeadlocksWithWindows) {
  USE_FAKE_CUPTI();
  // CUPTI's own delivery thread, and a flush that holds CUPTI's lock a while.
  fake().start_worker(200);
  fake().flush_delay_us(300);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::uint64_t> queue;
  bool training_done = false;
  std::atomic<int> timed{0}, untimed{0}, wrong{0};
  within(20, "300 sampled backwards with their audits", [&] {
    std::thread auditor([&] {
      for (;;) {
        std::uint64_t w = 0;
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return training_done || !queue.empty(); });
          if (queue.empty()) return;
          w = queue.front();
          queue.pop_front();
        }
        const auto us = window_kernel_us(w);
        if (!us) {
          ++untimed;
        } else if (*us != 5.0) {
          ++wrong;
        } else {
          ++timed;
        }
      }
    });
    for (int i = 0; i < 300; ++i) {  // the training thread: one window per sampled backward
      const std::uint64_t w = begin_window();
      fake().api_call(5000);
      end_window(w);
      if (w != 0) {
        std::lock_guard lock(mu);
        queue.push_back(w);
        cv.notify_all();
      }
    }
    {
      std::lock_guard lock(mu);
      training_done = true;
      cv.notify_all();
    }
    auditor.join();
  });
  fake().stop_worker();
  EXPECT_EQ(wrong.load(), 0);  // each window got its own kernel, and only it
  EXPECT_GT(timed.load(), 250) << "untimed " << untimed.load() << ", busy skips " << busy_skips();
  EXPECT_FALSE(subscribed());  // the last window closed the subscription
}

TEST(CuptiLocking, OverlappingWindowsKeepTheirOwnKernels) {
  USE_FAKE_CUPTI();
  // Two training threads (two devices) whose windows overlap.
  std::barrier sync(2);
  std::uint64_t wa = 0, wb = 0;
  within(20, "two overlapping windows", [&] {
    std::thread a([&] {
      wa = begin_window();
      sync.arrive_and_wait();  // 1: both open
      fake().api_call(3000);
      sync.arrive_and_wait();  // 2: both launched
      end_window(wa);
      sync.arrive_and_wait();  // 3: a closed
      sync.arrive_and_wait();  // 4: checked
    });
    std::thread b([&] {
      wb = begin_window();
      EXPECT_EQ(begin_window(), 0u);  // one window per thread at a time
      sync.arrive_and_wait();
      fake().api_call(7000);
      sync.arrive_and_wait();
      sync.arrive_and_wait();
      EXPECT_TRUE(subscribed());  // b's window is still open
      sync.arrive_and_wait();
      end_window(wb);
    });
    a.join();
    b.join();
  });
  ASSERT_NE(wa, 0u);
  ASSERT_NE(wb, 0u);
  EXPECT_FALSE(subscribed());
  // Read in the other order.
  EXPECT_EQ(window_kernel_us(wb).value_or(-1), 7.0);
  EXPECT_EQ(window_kernel_us(wa).value_or(-1), 3.0);

  // One thread, gradient accumulation: micro-batch 1's window, then micro-batch
  // 2's, before the auditor read the first; a kernel between windows counts for none.
  const std::uint64_t w1 = begin_window();
  fake().api_call(2000);
  fake().api_call(1000);
  end_window(w1);
  fake().api_call(50000);  // not in a window (and not recorded: unsubscribed)
  const std::uint64_t w2 = begin_window();
  fake().api_call(4000);
  end_window(w2);
  end_window(w2);  // idempotent (the explicit close, then the scope guard)
  EXPECT_EQ(window_kernel_us(w2).value_or(-1), 4.0);
  EXPECT_EQ(window_kernel_us(w1).value_or(-1), 3.0);
  EXPECT_FALSE(window_kernel_us(w1).has_value());  // forgotten once read
}

TEST(CuptiLocking, BusyFlushNeverStallsTheTrainingThread) {
  USE_FAKE_CUPTI();
  const std::uint64_t first = begin_window();
  ASSERT_NE(first, 0u);
  end_window(first);  // no kernel: its read waits (and flushes) for 500 ms
  fake().flush_delay_us(300000);  // each flush holds CUPTI's lock, and so the control lock, 300 ms
  std::thread auditor([&] { (void)window_kernel_us(first); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // inside the first flush
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  std::string why;
  const std::uint64_t w = begin_window(&why);
  const double begin_ms = ms_since(t0);
  EXPECT_EQ(w, 0u);
  EXPECT_EQ(why, "CUPTI busy");
  EXPECT_LT(begin_ms, 150.0);
  EXPECT_GE(busy_skips(), 1u);
  auditor.join();
  fake().flush_delay_us(0);
  // A window that ends while a flush holds the lock: end_window does not
  // wait for it; the flusher ends the idle subscription.
  const std::uint64_t second = begin_window();
  ASSERT_NE(second, 0u);
  fake().api_call(1000);
  fake().flush_delay_us(300000);
  std::thread flusher([&] { (void)window_kernel_us(second); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  t0 = Clock::now();
  end_window(second);
  EXPECT_LT(ms_since(t0), 150.0);
  flusher.join();
  EXPECT_FALSE(subscribed());
  EXPECT_FALSE(fake().subscribed());
  fake().flush_delay_us(0);
}

TEST(CuptiLocking, EmptyWindowsEndTheUseOfCuptiAndStopEndsWaits) {
  USE_FAKE_CUPTI();
  for (int i = 0; i < 3; ++i) {
    const std::uint64_t w = begin_window();
    ASSERT_NE(w, 0u);
    end_window(w);
    EXPECT_FALSE(window_kernel_us(w).has_value());
  }
  EXPECT_FALSE(status().usable);
  EXPECT_NE(status().detail.find("no kernel records"), std::string::npos) << status().detail;
  EXPECT_EQ(begin_window(), 0u);

  USE_FAKE_CUPTI();
  const std::uint64_t w = begin_window();
  ASSERT_NE(w, 0u);
  end_window(w);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread reader([&] { EXPECT_FALSE(window_kernel_us(w).has_value()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop(1.0);
  reader.join();
  EXPECT_LT(ms_since(t0), 300.0);
  EXPECT_EQ(begin_window(), 0u);  // no window after stop
  EXPECT_TRUE(status().usable);   // a cut-short wait is not an empty window
  EXPECT_FALSE(fake().subscribed());
}
#endif

}  // namespace
}  // namespace gaugewatch::hooks::cupti
