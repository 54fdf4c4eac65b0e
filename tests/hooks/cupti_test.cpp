// CUPTI kernel timing (hooks/cupti_timing.h): every way CUPTI can be
// unusable falls back to CUDA events with its reason, on a machine without
// a GPU. The real libcupti of the torch wheel is loaded when it is there
// (GAUGEWATCH_TEST_CUPTI_LIB): without a driver its cuptiSubscribe fails,
// which is the fallback taken when no GPU / a broken driver is present. The
// path with a GPU is tests/python/test_hooks_gpu.py (CUPTI source, and a
// second subscriber holding CUPTI).

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

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

}  // namespace
}  // namespace gaugewatch::hooks::cupti
