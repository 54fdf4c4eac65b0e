#pragma once
// kernels/cuda/mbarrier.cuh on the CPU emulation's threads (each CUDA thread
// is a std::thread, emulation.cpp): the barrier's state lives in its own
// 64-bit word in the block's shared memory, read and written under one
// process-wide mutex; a phase completion wakes the waiters through a
// condition variable. So arrival counts, transaction bytes, the phase flip
// when both reach zero and try_wait's parity rule behave as the PTX ISA states
// (mbarrier.cuh), and the mutex orders the writes before an arrival (or a
// copy's complete_tx) before the reads after the wait that sees its phase
// complete, as the hardware's release/acquire does.
//
// State word: bits 0-11 pending arrivals, 12-23 expected arrivals, 24-44
// tx-count (21-bit two's complement), 45 phase parity, 46-63 a tag written by
// init. Shared memory starts as NaN in the emulation, so a barrier used before
// init (or after inval) lacks the tag and aborts with a message; so do
// counts past the emulated range (4095 arrivals, the hardware allows 2^20 - 1),
// a tx-count outside +-(2^20 - 1) (the hardware's limit), and an arrival on a
// phase with no pending arrivals (undefined on the hardware).
//
// try_wait blocks up to 1 ms for the phase (the hardware's try_wait also
// suspends), so a spinning wait loop does not starve the other CPU threads;
// wait() gives up after 120 s and aborts: a barrier that never completes is a
// deadlock in the kernel (a missing arrival, a wrong parity or byte count).
// Not modelled: fence_init (init is visible at once), memory ordering
// weaker than the mutex's, and the cluster scope.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "cuda_runtime.h"

namespace gaugewatch::gpu::mbarrier {

namespace emulated {

inline constexpr uint64_t kTag = 0x2b7e5;
inline constexpr uint32_t kMaxCount = (1u << 12) - 1;
inline constexpr int64_t kMaxTx = (1 << 20) - 1;

struct State {
  uint32_t pending = 0, expected = 0;
  int64_t tx = 0;
  uint32_t parity = 0;
};

inline std::mutex& mutex() {
  static std::mutex m;
  return m;
}
inline std::condition_variable& completed() {
  static std::condition_variable cv;
  return cv;
}

[[noreturn]] inline void fail(const char* what, const void* bar) {
  std::fprintf(stderr, "mbarrier emulation: %s (barrier at %p, thread %u of block %u)\n", what, bar, threadIdx.x,
               blockIdx.x);
  std::abort();
}

inline uint64_t encode(const State& s) {
  return uint64_t{s.pending} | (uint64_t{s.expected} << 12) | ((static_cast<uint64_t>(s.tx) & 0x1fffffu) << 24) |
         (uint64_t{s.parity} << 45) | (kTag << 46);
}

// Callers hold mutex().
inline State decode(const uint64_t* bar) {
  const uint64_t w = *bar;
  if ((w >> 46) != kTag) fail("barrier used before init (or after inval)", bar);
  State s;
  s.pending = static_cast<uint32_t>(w & 0xfffu);
  s.expected = static_cast<uint32_t>((w >> 12) & 0xfffu);
  const int64_t tx = static_cast<int64_t>((w >> 24) & 0x1fffffu);
  s.tx = tx >= (int64_t{1} << 20) ? tx - (int64_t{1} << 21) : tx;
  s.parity = static_cast<uint32_t>((w >> 45) & 1u);
  return s;
}

// Stores s, completing the phase first when nothing is pending. Callers hold
// mutex().
inline void store(uint64_t* bar, State s) {
  if (s.tx > kMaxTx || s.tx < -kMaxTx) fail("tx-count outside +-(2^20 - 1)", bar);
  const bool complete = s.pending == 0 && s.tx == 0;
  if (complete) {
    s.parity ^= 1u;
    s.pending = s.expected;
  }
  *bar = encode(s);
  if (complete) completed().notify_all();
}

inline void change(uint64_t* bar, int64_t tx_delta, uint32_t arrivals) {
  const std::lock_guard lock(mutex());
  State s = decode(bar);
  s.tx += tx_delta;
  if (arrivals > s.pending) fail("arrival on a phase with no pending arrivals", bar);
  s.pending -= arrivals;
  store(bar, s);
}

// The hardware's side of a copy that names the barrier: its bytes have landed.
inline void complete_tx(uint64_t* bar, uint32_t bytes) { change(bar, -static_cast<int64_t>(bytes), 0); }

inline bool phase_done(const uint64_t* bar, uint32_t parity) { return decode(bar).parity != (parity & 1u); }

}  // namespace emulated

inline void init(uint64_t* bar, uint32_t count) {
  if (count == 0 || count > emulated::kMaxCount) emulated::fail("init count outside 1 .. 4095 (emulated range)", bar);
  if (reinterpret_cast<uintptr_t>(bar) % 8 != 0) emulated::fail("barrier not 8-byte aligned", bar);
  const std::lock_guard lock(emulated::mutex());
  emulated::State s;
  s.pending = s.expected = count;
  *bar = emulated::encode(s);
}

inline void fence_init() {}

inline void inval(uint64_t* bar) {
  const std::lock_guard lock(emulated::mutex());
  *bar = 0;
}

inline void arrive(uint64_t* bar) { emulated::change(bar, 0, 1); }

inline void arrive_expect_tx(uint64_t* bar, uint32_t bytes) { emulated::change(bar, static_cast<int64_t>(bytes), 1); }

inline bool try_wait(uint64_t* bar, uint32_t parity) {
  std::unique_lock lock(emulated::mutex());
  return emulated::completed().wait_for(lock, std::chrono::milliseconds(1),
                                        [&] { return emulated::phase_done(bar, parity); });
}

inline void wait(uint64_t* bar, uint32_t parity) {
  std::unique_lock lock(emulated::mutex());
  if (!emulated::completed().wait_for(lock, std::chrono::seconds(120),
                                      [&] { return emulated::phase_done(bar, parity); })) {
    emulated::fail("wait: the phase did not complete in 120 s (deadlock: missing arrival, parity or tx bytes?)", bar);
  }
}

}  // namespace gaugewatch::gpu::mbarrier
