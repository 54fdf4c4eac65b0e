#include "kernels/torch/stride_order.h"

#include <ATen/ATen.h>
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <cstddef>

namespace gaugewatch::torch_ops {

std::vector<int64_t> stride_order(const at::Tensor& t) {
  const int64_t dims = t.dim();
  std::vector<int64_t> order(static_cast<size_t>(dims));
  for (int64_t i = 0; i < dims; ++i) order[static_cast<size_t>(i)] = i;
  if (dims > 1) {
    std::stable_sort(order.begin(), order.end() - 1, [&](int64_t x, int64_t y) {
      return t.sym_stride(x) > t.sym_stride(y);
    });
  }
  return order;
}

namespace {

// order as a permutation of t's dims; inverse[d]: the position of dim d in order.
std::vector<int64_t> inverse_of(const at::Tensor& t, c10::IntArrayRef order) {
  const size_t dims = static_cast<size_t>(t.dim());
  TORCH_INTERNAL_ASSERT(order.size() == dims, "gaugewatch: a dim order of ", order.size(), " dims for a ", dims,
                        "-D tensor");
  std::vector<int64_t> inverse(dims, -1);
  for (size_t i = 0; i < dims; ++i) {
    const int64_t d = order[i];
    TORCH_INTERNAL_ASSERT(d >= 0 && static_cast<size_t>(d) < dims && inverse[static_cast<size_t>(d)] < 0,
                          "gaugewatch: ", order, " is not a permutation of the dims");
    inverse[static_cast<size_t>(d)] = static_cast<int64_t>(i);
  }
  return inverse;
}

}  // namespace

at::Tensor empty_in_order(const at::Tensor& like, c10::IntArrayRef order, const at::TensorOptions& options) {
  const std::vector<int64_t> inverse = inverse_of(like, order);
  std::vector<c10::SymInt> sizes;
  sizes.reserve(order.size());
  for (const int64_t d : order) sizes.push_back(like.sym_size(d));
  return at::empty_symint(sizes, options).permute(inverse);
}

at::Tensor empty_in_stride_order(const at::Tensor& like, const at::TensorOptions& options) {
  return empty_in_order(like, stride_order(like), options);
}

at::Tensor to_order(const at::Tensor& t, c10::IntArrayRef order, c10::ScalarType dtype) {
  const std::vector<int64_t> inverse = inverse_of(t, order);
  if (t.scalar_type() == dtype) {
    // The strides of empty_in_order's result: at::empty's of the permuted sizes.
    std::vector<int64_t> sizes;
    sizes.reserve(order.size());
    for (const int64_t d : order) sizes.push_back(t.size(d));
    const c10::DimVector dense = c10::contiguous_strides(sizes);
    bool same = true;
    for (size_t d = 0; d < inverse.size(); ++d) {
      same = same && t.stride(static_cast<int64_t>(d)) == dense[static_cast<size_t>(inverse[d])];
    }
    if (same) return t;
  }
  return empty_in_order(t, order, t.options().dtype(dtype)).copy_(t);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> in_operand_order(
    const std::tuple<at::Tensor, at::Tensor, at::Tensor>& grads, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v) {
  const auto& [dq, dk, dv] = grads;
  return {to_order(dq, stride_order(q), dq.scalar_type()), to_order(dk, stride_order(k), dk.scalar_type()),
          to_order(dv, stride_order(v), dv.scalar_type())};
}

}  // namespace gaugewatch::torch_ops
