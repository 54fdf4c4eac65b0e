// The gradient layout the hooks hand back (stock_grad_layout, hooks/sdpa_ops.h)
// on what gaugewatch::attention_backward returns (dense in the operands'
// stride order, kernels/torch/stride_order.h): for CUDA flash and cuDNN calls
// that is the stock layout, so the op's tensor comes back as it is, with no
// copy; CPU flash and efficient calls get (B, N, H, d) transposed, copied only
// where the op's layout is not that. Device-independent (the layout depends
// on the op kind and the strides), so CPU tensors stand in for CUDA ones.
// Part of hooks_audit_tests (its main sets the environment the linked hooks
// read when they load).

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "hooks/sdpa_ops.h"
#include "kernels/torch/stride_order.h"

namespace gaugewatch::hooks {
namespace {

// (B, H, L, d) strides of a dense (B, L, H, d) tensor viewed as (B, H, L, d).
std::vector<int64_t> row_order_strides(const at::Tensor& t) {
  const int64_t h = t.size(1), l = t.size(2), d = t.size(3);
  return {l * h * d, d, h * d, 1};
}

TEST(StockGradLayout, TheOpsGradientComesBackWithoutACopyWhereLayoutsMatch) {
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  const at::Tensor contiguous = at::randn({2, 4, 8, 16}, bf16);
  const at::Tensor transposed = at::randn({2, 8, 4, 16}, bf16).transpose(1, 2);
  const at::Tensor fused = at::randn({2, 8, 3, 4, 16}, bf16).select(2, 1).transpose(1, 2);  // a qkv slice
  for (const at::Tensor& input : {contiguous, transposed, fused}) {
    SCOPED_TRACE(::testing::PrintToString(input.strides().vec()));
    const at::Tensor grad = torch_ops::empty_in_stride_order(input, input.options()).copy_(input);
    const std::vector<int64_t> want = input.is_contiguous() ? input.strides().vec() : row_order_strides(input);
    EXPECT_EQ(grad.strides().vec(), want);
    for (const OpKind kind : {OpKind::kCudaFlash, OpKind::kCudnn}) {
      EXPECT_TRUE(stock_grad_layout(grad, input, kind).is_same(grad)) << op_name(kind);
    }
    for (const OpKind kind : {OpKind::kCpuFlash, OpKind::kEfficient}) {
      const at::Tensor got = stock_grad_layout(grad, input, kind);
      EXPECT_EQ(got.strides().vec(), row_order_strides(input)) << op_name(kind);
      EXPECT_EQ(got.is_same(grad), !input.is_contiguous()) << op_name(kind);
      EXPECT_TRUE(got.equal(input)) << op_name(kind);
    }
    // Backend fp32's float32 gradient: converted to the input's dtype, in its layout.
    const at::Tensor converted = stock_grad_layout(grad.to(at::kFloat), input, OpKind::kCudnn);
    EXPECT_EQ(converted.scalar_type(), at::kBFloat16);
    EXPECT_EQ(converted.strides().vec(), want);
    EXPECT_TRUE(converted.equal(input));
  }
}

// The rule keeps the last dim last: a broadcast (stride-0) dim goes before
// it, so rows stay contiguous (the kernels write them so).
TEST(StockGradLayout, BroadcastDimsStayOutsideTheRows) {
  const at::Tensor shared_head = at::randn({2, 1, 8, 16}).expand({2, 4, 8, 16});
  EXPECT_EQ(torch_ops::stride_order(shared_head), (std::vector<int64_t>{0, 2, 1, 3}));
  const at::Tensor grad = torch_ops::empty_in_stride_order(shared_head, shared_head.options());
  EXPECT_EQ(grad.strides().vec(), row_order_strides(grad));
}

}  // namespace
}  // namespace gaugewatch::hooks
