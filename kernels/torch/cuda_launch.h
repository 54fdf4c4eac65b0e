#pragma once
// The CUDA kernels behind the gaugewatch ops, launched from checked torch
// tensors on one stream: shared by the backward ops (ops_cuda.cpp) and the
// metrics op (ops_cuda_metrics.cpp), so the parameter blocks are filled in one
// place. Kernel APIs: kernels/cuda/bf16_backward.h, kernels/cuda/fp32_backward.h.

#include <ATen/core/Tensor.h>
#include <cuda_runtime.h>

#include <optional>
#include <tuple>

#include "kernels/cuda/bf16_backward.h"
#include "kernels/cuda/fp32_backward.h"
#include "kernels/cuda/problem_fields.h"
#include "kernels/torch/attention_call.h"

namespace gaugewatch::torch_ops {

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;


// cu_seqlens as int32 on q's device (undefined tensors when not packed).
// Offsets still on the CPU are checked (0 first, length last, non-decreasing);
// device offsets are trusted and clamped by the kernels, since checking them
// would synchronize the stream.
struct DeviceOffsets {
  at::Tensor q, k;
  int64_t segments() const { return q.defined() ? q.numel() - 1 : 0; }
};
DeviceOffsets device_offsets(const AttentionCall& call, const std::optional<at::Tensor>& cu_seqlens_q,
                             const std::optional<at::Tensor>& cu_seqlens_k, const at::Tensor& q);

// The fused BF16 backward (BF16 operands, SDPA strides taken as they are when
// rows are 16-byte aligned); BF16 gradients, contiguous. `diag` only with
// projection kNone.
Grads fused_bf16_backward(const AttentionCall& call, gpu::Projection projection, const at::Tensor& grad_out,
                          const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                          const at::Tensor& lse, const DeviceOffsets& offsets, const gpu::Bf16RowDiagnostics& diag,
                          cudaStream_t stream);

// The fused FP32 backward on FP32 contiguous operands; full, or the row
// subset (slices, rows: int32 on the device) when given.
struct Fp32Subset {
  at::Tensor slices, rows;
};
Grads fused_fp32_backward(const AttentionCall& call, const at::Tensor& grad_out_f32, const at::Tensor& q_f32,
                          const at::Tensor& k_f32, const at::Tensor& v_f32, const DeviceOffsets& offsets,
                          const std::optional<Fp32Subset>& subset, bool deterministic, bool center_keys,
                          cudaStream_t stream);

}  // namespace gaugewatch::torch_ops
