#pragma once
// One queued audit (auditor.h): what the training thread hands to the
// auditor thread. Made by audit_slicing.cpp, measured by audit_measure.cpp,
// written by audit_capture.cpp.

#include <ATen/core/Tensor.h>

#if defined(GAUGEWATCH_HOOKS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "hooks/agent_messages.h"
#include "hooks/backward_timing.h"
#include "hooks/runtime.h"

namespace gaugewatch::hooks {

// A slice of one call: on the CPU for a CPU call, on the GPU (made on the
// side stream) for a CUDA call; a whole call's operands for a capture.
struct Operands {
  at::Tensor grad_out, q, k, v, out, lse;  // (S, 1, R, d) ... as in SDPA layout
  at::Tensor mask;                         // (S, 1, R, M) of the call's mask / bias; undefined: none
};

struct Job {
  BackwardPlan plan;
  Backend ran = Backend::kStock;
  double backward_us = 0.0;
  std::chrono::steady_clock::time_point queued;
  SampleData data;  // shape filled at submit, metrics and timings by the auditor
  bool is_causal = false;
  std::string alignment = "top_left";
  std::optional<double> scale;
  bool compare_dkdv = false;
  bool sample = false;
  Operands slice;
  at::Tensor live_dq, live_dk, live_dv;
  bool capture = false;
  Operands whole;
  std::string op;
#if defined(GAUGEWATCH_HOOKS_CUDA)
  std::optional<c10::cuda::CUDAStream> side;            // the audit's stream (CUDA samples)
  std::shared_ptr<at::cuda::CUDAEvent> copied;          // side stream: slices / copies done
  std::shared_ptr<at::cuda::CUDAEvent> backward_start;  // training stream, before the backward
  std::shared_ptr<at::cuda::CUDAEvent> backward_end;    // training stream, after it
#endif
  std::shared_ptr<CudaTiming> timing;  // its CUPTI window, if any
};

// Whether waits on the GPU should end now (exit: past the auditor's drain deadline).
bool auditor_giving_up();

}  // namespace gaugewatch::hooks
