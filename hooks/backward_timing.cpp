#include "hooks/backward_timing.h"

#if defined(GAUGEWATCH_HOOKS_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

#include <cstdlib>
#include <mutex>

#include "hooks/cupti_timing.h"
#include "hooks/runtime.h"

namespace gaugewatch::hooks {

CudaTiming::~CudaTiming() {
  if (!consumed) cupti::discard_window(cupti_window);
}

std::optional<double> kernel_time_us(CudaTiming& timing) {
  if (timing.cupti_window == 0) return std::nullopt;
  timing.consumed = true;
  const std::optional<double> us = cupti::window_kernel_us(timing.cupti_window);
  if (!us) {
    // CUPTI may have given up (no records arriving): the stats say so.
    if (const cupti::Status st = cupti::status(); !st.usable) runtime().set_timing_source("cuda_events", st.detail);
  }
  return us;
}

std::shared_ptr<CudaTiming> start_backward_timing(const at::Tensor& q) {
#if defined(GAUGEWATCH_HOOKS_CUDA)
  if (!q.is_cuda()) return nullptr;
  try {
    auto timing = std::make_shared<CudaTiming>();
    // Once: CUPTI if it loads and can be subscribed, else CUDA events (stats "timing").
    static const bool reported = [] {
      const cupti::Status st = cupti::init(runtime().config().timing, runtime().config().cupti_lib);
      runtime().set_timing_source(st.usable ? "cupti" : "cuda_events", st.detail);
      return true;
    }();
    (void)reported;
    // The events are recorded either way: a window that gets no kernel record
    // (a profiler took CUPTI meanwhile) falls back to them.
    timing->start = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    timing->start->record(c10::cuda::getCurrentCUDAStream(q.device().index()));
    timing->cupti_window = cupti::begin_window();
    // Once CUDA and CUPTI are initialized (their exit handlers registered):
    // an exit handler of ours registered after theirs runs before them, so
    // the auditor is stopped and CUPTI unsubscribed while both still work.
    static std::once_flag exit_handler;
    std::call_once(exit_handler, [] { std::atexit([] { runtime().shutdown(); }); });
    return timing;
  } catch (const std::exception&) {
    return nullptr;
  }
#else
  (void)q;
  return nullptr;
#endif
}

void end_backward_timing(const std::shared_ptr<CudaTiming>& timing) {
  if (timing) cupti::end_window(timing->cupti_window);
}

}  // namespace gaugewatch::hooks
