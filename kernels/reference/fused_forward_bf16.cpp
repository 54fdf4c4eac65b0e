#include "kernels/reference/fused_forward_bf16.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/reference/bf16.h"
#include "kernels/reference/constants.h"
#include "kernels/reference/parallel.h"
#include "kernels/reference/vector_math.h"

namespace gaugewatch::reference {

SavedForward forward_fused_bf16(const AttentionInputs& in) {
  in.validate();
  const AttentionShape& sh = in.shape;
  const int64_t d = sh.head_dim;
  SavedForward saved;
  saved.out.assign(sh.q_elements(), 0.0f);
  saved.lse.assign(sh.q_rows(), std::numeric_limits<float>::infinity());
  const float scale = static_cast<float>(in.scale);
  const float scale_log2 = scale * kLog2e;

  // Rows are independent: one work item per (b, h), each with its own buffers.
  parallel_for(sh.batch * sh.q_heads, [&](int64_t bh) {
    const int64_t b = bh / sh.q_heads, h = bh % sh.q_heads, hk = h / sh.group();
    const float* k0 = &in.k[sh.kv_offset(b, hk, 0)];
    const float* v0 = &in.v[sh.kv_offset(b, hk, 0)];
    std::vector<float> s(sh.kv_len), acc(d);
    for (int64_t n = 0; n < sh.q_len; ++n) {
      const KeyRange keys = visible_keys(in, n);
      if (keys.size() == 0) continue;
      const BiasRow bias = in.bias_row(b, h, n);
      const float* q = &in.q[sh.q_offset(b, h, n)];
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        s[j] = dot<float>(q, k0 + j * d, d);
        // With a bias the row max is taken over the biased, scaled scores.
        if (!bias.empty()) s[j] = std::fma(s[j], scale, bias[j]);
        mx = std::max(mx, s[j]);
      }
      if (mx == -std::numeric_limits<float>::infinity()) continue;  // every key masked
      const float step = bias.empty() ? scale_log2 : kLog2e;  // s in unscaled or in scaled units
      const float max_scaled = mx * step;
      float l = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        const float p = std::exp2(std::fma(s[j], step, -max_scaled));
        l += p;
        axpy(round_bf16(p), v0 + j * d, acc.data(), d);  // P V with BF16 P
      }
      float* o = &saved.out[sh.q_offset(b, h, n)];
      const float inv_l = 1.0f / l;
      for (int64_t c = 0; c < d; ++c) o[c] = round_bf16(acc[c] * inv_l);
      saved.lse[sh.lse_offset(b, h, n)] = (bias.empty() ? mx * scale : mx) + std::log(l);
    }
  });
  return saved;
}

}  // namespace gaugewatch::reference
