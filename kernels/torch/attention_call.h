#pragma once
// Argument checking shared by every backend of the gaugewatch torch ops
// (CPU, CUDA, Meta), so a bad call fails with the same TORCH_CHECK message
// wherever it lands. Schemas: kernels/torch/registration.cpp.

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/common/backend.h"
#include "kernels/reference/attention_problem.h"

namespace gaugewatch::torch_ops {

// Backends of gaugewatch::attention_backward: the rows of the backend table
// (kernels/common/backend.h) marked `op`.
using gaugewatch::Backend;

// The backend named by an op's `backend` argument; a TORCH_CHECK error for
// a name the ops do not take.
Backend parse_backend(c10::string_view name);
const char* backend_name(Backend backend);
// Output dtype of a backend (the table's `output`): BF16 for the fused ones, FP32 / FP64 otherwise.
c10::ScalarType backend_dtype(Backend backend);

// One checked call: shapes in SDPA layout and the masking it asks for.
struct AttentionCall {
  reference::AttentionShape shape;  // B, Hq, Hkv, N, M, d
  reference::CausalMode causal = reference::CausalMode::kNone;
  double scale = 0.0;               // given, or 1 / sqrt(d)
  bool packed = false;
};

// The checks that need no concrete sizes (dtypes, ranks, devices, the causal
// alignment, cu_seqlens given together, 1-D and integer): safe on fake tensors
// with symbolic shapes, so the Meta kernels run them too.
void check_operands(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& out, const at::Tensor& lse, c10::string_view causal_alignment,
                    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k);

// check_operands, then every size precondition shared by the backends: BF16 q, k, v, out,
// grad_out and FP32 lse, all 4-D (B, H, N, d) / 3-D (B, Hq, N) with matching
// sizes, on one device, GQA divisibility, a known causal alignment, and
// cu_seqlens given together as 1-D integer tensors of equal length >= 2.
AttentionCall check_attention_call(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                   bool is_causal, std::optional<double> scale, c10::string_view causal_alignment,
                                   const std::optional<at::Tensor>& cu_seqlens_q,
                                   const std::optional<at::Tensor>& cu_seqlens_k);

// Row-subset arguments of attention_backward_rows: 1-D integer tensors on q's
// device (symbolic-shape safe).
void check_row_subset_operands(const at::Tensor& slices, const at::Tensor& rows, const at::Tensor& q);
// The same, plus values: slices in [0, B * Hq), rows in [0, N), both distinct
// (for CPU tensors; device values are not read back: the kernel treats
// out-of-range ones as empty, and a repeated one counts twice in dk and dv).
void check_row_subset(const AttentionCall& call, const at::Tensor& slices, const at::Tensor& rows,
                      const at::Tensor& q);

}  // namespace gaugewatch::torch_ops
