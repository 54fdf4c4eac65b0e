#pragma once
// The layout of the gradients the gaugewatch ops return, one rule for every
// device (CPU, CUDA, Meta) and for the hooks (hooks/sdpa_ops.cpp): a
// gradient of an input is dense, with its dims in the input's stride order.
// That is the layout SDPA's CUDA flash and cuDNN backwards give (torch 2.11;
// docs/hooks.md, Gradient layout): a contiguous q gets a contiguous
// gradient, SDPA's (B, N, H, d) views and slices of a fused qkv projection a
// (B, N, H, d)-transposed one. Symbolic-shape safe (fake tensors compare
// strides by guards), except to_order, which runs on real tensors.

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/core/TensorOptions.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace gaugewatch::torch_ops {

// `t`'s dims from outermost to innermost: dims 0 .. r-2 by stride, largest
// first (equal strides keep their order), then the last dim, so rows stay
// contiguous (the kernels write them so). For every tensor whose last dim
// has the smallest stride (all the stock SDPA ops take) this is the order
// of all r dims by stride; a broadcast (stride-0) dim goes before the last
// dim instead of after it.
std::vector<int64_t> stride_order(const at::Tensor& t);

// Uninitialised storage of `like`'s sizes, dense, its dims laid out in
// `order` (outermost first; a permutation of 0 .. r-1).
at::Tensor empty_in_order(const at::Tensor& like, c10::IntArrayRef order, const at::TensorOptions& options);

// empty_in_order(like, stride_order(like), options): how attention_backward
// returns the gradient of `like`.
at::Tensor empty_in_stride_order(const at::Tensor& like, const at::TensorOptions& options);

// `t` in `dtype`, dense with its dims in `order`: `t` itself when it already
// has that dtype and the strides empty_in_order gives, else a copy.
at::Tensor to_order(const at::Tensor& t, c10::IntArrayRef order, c10::ScalarType dtype);

// (dq, dk, dv) as attention_backward returns them on every device: each in
// its own dtype, dense in the stride order of q, k, v (to_order: a copy only
// where a backend computed another layout).
std::tuple<at::Tensor, at::Tensor, at::Tensor> in_operand_order(
    const std::tuple<at::Tensor, at::Tensor, at::Tensor>& grads, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v);

}  // namespace gaugewatch::torch_ops
