#pragma once
// Kernel timing of sampled CUDA backwards through CUPTI's activity API, with
// libcupti loaded at run time (dlopen): the hooks never depend on it.
//
// A *window* brackets the host code of one sampled backward on the calling
// thread: begin_window() subscribes to CUPTI (only while a window is open, so
// a profiler started between samples can have CUPTI), enables the runtime /
// driver API callbacks, which note the correlation id of every API call this
// thread makes, and the kernel activity records; end_window() turns them off
// again. Once the GPU has run the window's kernels (the auditor waits on its
// copy event, which is ordered after them), window_kernel_us() flushes
// CUPTI's buffers and sums the durations of the kernel records whose
// correlation ids the window noted.
//
// Whenever CUPTI cannot be used (GAUGEWATCH_TIMING=events, no libcupti,
// cuptiSubscribe refused: another subscriber (a profiler: nsys, ncu,
// torch.profiler's Kineto) holds it, or no GPU / driver; an activity call
// failing) begin_window() returns 0 and the caller times with CUDA
// events; the reason is logged once and kept in status().
//
// Locks and waits (docs/hooks.md "Locks and waits"): the CUPTI callbacks
// take only a leaf lock that is never held across a CUPTI call; every CUPTI
// call this file makes is serialized by a second lock that no callback takes
// and that the training thread (begin_window / end_window) only tries for
// 20 ms: when a flush holds it, the sample is timed with CUDA events
// (begin_window) or the idle subscription is ended by the flusher
// (end_window). window_kernel_us waits at most 500 ms, and returns at once
// after stop().
//
// Torch-free and CUDA-runtime-free: unit-tested on a machine without a GPU
// (tests/hooks/cupti_test.cpp).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gaugewatch::hooks::cupti {

struct Status {
  bool usable = false;     // a window may be opened
  std::string library;     // the libcupti loaded ("" when none)
  std::string detail;      // "ok", or why CUPTI is not used
};

// Loads libcupti once (the first call decides; later calls return the same
// status): `mode` "events" never loads it; `library` overrides the search.
Status init(const std::string& mode, const std::string& library);
Status status();

// The libcupti paths init() tries, in order, for an empty override: the
// names the dynamic loader resolves (libcupti.so, .so.13, .so.12), the
// directories of the torch wheel's nvidia packages next to a loaded
// libtorch_cuda / libc10_cuda, and the CUDA toolkit's
// (extras/CUPTI/lib64, targets/x86_64-linux/lib, lib64).
std::vector<std::string> library_candidates(const std::string& library);

// 0 when CUPTI is not usable or the subscription was refused (then
// `why` says so, and the refusal is logged once).
std::uint64_t begin_window(std::string* why = nullptr);
void end_window(std::uint64_t id);
// The summed GPU time of the window's kernels in microseconds, or nullopt
// when no kernel record of it arrived within 500 ms (CUPTI returns a buffer
// only when all its records, possibly of later windows, are complete);
// forgets the window.
std::optional<double> window_kernel_us(std::uint64_t id);
// Forgets a window whose sample was dropped.
void discard_window(std::uint64_t id);
// At exit (before CUPTI's and the CUDA runtime's own exit handlers when
// possible): no new window opens, waits for records end at once, kernel
// records are disabled and the subscription ended (waiting at most
// timeout_s for the lock).
void stop(double timeout_s);
// Kernel records seen in all (tests).
std::uint64_t kernel_records();
// Windows not opened because the control lock stayed busy (stats).
std::uint64_t busy_skips();
// Whether a CUPTI subscription is held now (tests).
bool subscribed();
// Tests only: the next init() decides again.
void reset_for_tests();

}  // namespace gaugewatch::hooks::cupti
