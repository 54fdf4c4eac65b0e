#include "kernels/reference/exact_attention.h"

#include "kernels/reference/softmax_attention.h"

namespace gaugewatch::reference {

ExactAttention attention_fp64(const AttentionInputs& in) {
  in.validate();
  auto r = detail::softmax_attention<double>(in, in.k, /*with_forward=*/true);
  ExactAttention result;
  result.out = std::move(r.out);
  result.lse = std::move(r.lse);
  result.dq = std::move(r.dq);
  result.dk = std::move(r.dk);
  result.dv = std::move(r.dv);
  result.max_relative_row_sum = r.max_relative_row_sum;
  return result;
}

}  // namespace gaugewatch::reference
