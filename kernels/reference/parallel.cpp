#include "kernels/reference/parallel.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace gaugewatch::reference {

int reference_thread_count() {
  if (const char* env = std::getenv("GAUGEWATCH_THREADS")) {
    const int requested = std::atoi(env);
    if (requested > 0) return requested;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void parallel_for(int64_t count, const std::function<void(int64_t)>& fn) {
  if (count <= 0) return;
  const int64_t workers = std::min<int64_t>(reference_thread_count(), count);
  if (workers == 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto work = [&] {
    for (int64_t i = next++; i < count; i = next++) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard lock(failure_mutex);
        if (!failure) failure = std::current_exception();
        next = count;  // stop handing out items
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  try {
    for (int64_t t = 1; t < workers; ++t) threads.emplace_back(work);
  } catch (const std::system_error&) {
    // No more threads to be had (a pids limit, memory): the items are handed
    // out by `next`, so the threads that did start and this one do them all.
  }
  work();
  for (auto& thread : threads) thread.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace gaugewatch::reference
