#pragma once
// Timing of a sampled backward. CUDA: an event recorded on the training
// stream before the backward (its kernel time, without synchronizing); with
// CUPTI usable (cupti_timing.h) also a CUPTI window on this thread, closed by
// end_backward_timing() right after the backward's launches; the auditor
// then reports the window's kernel time (stats "timing"). CPU calls are timed
// by the host clock (no CudaTiming).

#include <ATen/core/Tensor.h>

#if defined(GAUGEWATCH_HOOKS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#endif

#include <cstdint>
#include <memory>
#include <optional>

namespace gaugewatch::hooks {

struct CudaTiming {
#if defined(GAUGEWATCH_HOOKS_CUDA)
  std::shared_ptr<at::cuda::CUDAEvent> start;
#endif
  std::uint64_t cupti_window = 0;  // 0: none (CUDA events time the backward)
  bool consumed = false;
  ~CudaTiming();
};

// nullptr for CPU tensors.
std::shared_ptr<CudaTiming> start_backward_timing(const at::Tensor& q);
void end_backward_timing(const std::shared_ptr<CudaTiming>& timing);
// The CUPTI window's kernel time; nullopt without a window or when CUPTI gave
// none (then the CUDA events time the backward).
std::optional<double> kernel_time_us(CudaTiming& timing);

}  // namespace gaugewatch::hooks
