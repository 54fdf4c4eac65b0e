#pragma once
// A ProblemShape (kernels/cuda/problem.h) from the CPU reference's description
// of a problem: one conversion for the torch ops (kernels/torch/cuda_launch.cpp,
// ops_cuda_metrics.cpp) and the kernel tests (tests/cuda). Header-only: it
// needs the reference's headers, not its library.

#include <cstdint>

#include "kernels/cuda/problem.h"
#include "kernels/reference/attention_problem.h"

namespace gaugewatch::gpu {

inline CausalMode to_gpu(reference::CausalMode mode) {
  switch (mode) {
    case reference::CausalMode::kTopLeft: return CausalMode::kTopLeft;
    case reference::CausalMode::kBottomRight: return CausalMode::kBottomRight;
    default: return CausalMode::kNone;
  }
}

// cu_q / cu_k: num_segments + 1 int32 device offsets each, or both null (not packed).
inline ProblemShape problem_shape(const reference::AttentionShape& sh, double scale, reference::CausalMode causal,
                                  const int32_t* cu_q = nullptr, const int32_t* cu_k = nullptr,
                                  int64_t num_segments = 0) {
  ProblemShape p;
  p.batch = sh.batch;
  p.q_heads = sh.q_heads;
  p.kv_heads = sh.kv_heads;
  p.q_len = sh.q_len;
  p.kv_len = sh.kv_len;
  p.head_dim = sh.head_dim;
  p.scale = scale;
  p.causal = to_gpu(causal);
  if (cu_q != nullptr) {
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = cu_k;
    p.num_segments = num_segments;
  }
  return p;
}

}  // namespace gaugewatch::gpu
