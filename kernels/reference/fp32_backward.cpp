#include "kernels/reference/fp32_backward.h"

#include <algorithm>
#include <vector>

#include "kernels/reference/softmax_attention.h"
#include "kernels/reference/vector_math.h"

namespace gaugewatch::reference {

namespace {

// Each key/value head's keys minus their mean (mean taken in double).
std::vector<float> centered_keys(const AttentionInputs& in) {
  const AttentionShape& sh = in.shape;
  const int64_t d = sh.head_dim;
  std::vector<float> k = in.k;
  std::vector<double> mean(d);
  for (int64_t b = 0; b < sh.batch; ++b) {
    for (int64_t hk = 0; hk < sh.kv_heads; ++hk) {
      float* k0 = &k[sh.kv_offset(b, hk, 0)];
      std::fill(mean.begin(), mean.end(), 0.0);
      for (int64_t j = 0; j < sh.kv_len; ++j) axpy(1.0, k0 + j * d, mean.data(), d);
      for (auto& x : mean) x /= static_cast<double>(sh.kv_len);
      for (int64_t j = 0; j < sh.kv_len; ++j) {
        for (int64_t c = 0; c < d; ++c) {
          k0[j * d + c] = static_cast<float>(static_cast<double>(k0[j * d + c]) - mean[c]);
        }
      }
    }
  }
  return k;
}

}  // namespace

Gradients backward_fp32(const AttentionInputs& in, const Fp32BackwardOptions& options) {
  in.validate();
  std::vector<float> centered;
  if (options.center_keys) centered = centered_keys(in);
  auto r = detail::softmax_attention<float>(in, options.center_keys ? centered : in.k, /*with_forward=*/false);
  return Gradients{std::move(r.dq), std::move(r.dk), std::move(r.dv)};
}

}  // namespace gaugewatch::reference
