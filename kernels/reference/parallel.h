#pragma once
// parallel_for over independent work items on std::threads. Results must not
// depend on which thread ran an item: callers give each item its own output
// (or private partial sums reduced afterwards in item order).

#include <cstdint>
#include <functional>

namespace gaugewatch::reference {

// Runs fn(i) for i in [0, count). Uses up to GAUGEWATCH_THREADS threads
// (environment), else std::thread::hardware_concurrency(); fewer when the
// system refuses more threads (never fails for that). Exceptions thrown by fn
// are rethrown on the calling thread (the first one wins).
void parallel_for(int64_t count, const std::function<void(int64_t)>& fn);

int reference_thread_count();

}  // namespace gaugewatch::reference
