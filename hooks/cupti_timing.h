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
// Kernel records seen in all (tests).
std::uint64_t kernel_records();
// Tests only: the next init() decides again.
void reset_for_tests();

}  // namespace gaugewatch::hooks::cupti
