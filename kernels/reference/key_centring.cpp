#include "kernels/reference/key_centring.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/reference/bf16.h"
#include "kernels/reference/vector_math.h"

namespace gaugewatch::reference {

CentringPolicy parse_centring_policy(std::string_view text) {
  if (text == "auto") return CentringPolicy::kAuto;
  if (text == "always") return CentringPolicy::kAlways;
  if (text == "never") return CentringPolicy::kNever;
  throw std::invalid_argument("unknown centring policy '" + std::string(text) + "': use auto, always or never");
}

std::string_view to_string(CentringPolicy policy) {
  switch (policy) {
    case CentringPolicy::kAuto: return "auto";
    case CentringPolicy::kAlways: return "always";
    case CentringPolicy::kNever: return "never";
  }
  return "unknown";
}

void choose_kbar(const float* keys, int64_t kv_len, int64_t head_dim, CentringPolicy policy,
                 GridRounding round_to_grid, float* kbar) {
  for (int64_t c = 0; c < head_dim; ++c) {
    kbar[c] = 0.0f;
    if (policy == CentringPolicy::kNever || kv_len == 0) continue;
    // Two passes in double: the one-pass form E[k^2] - m^2 cancels when the
    // offset dominates, which is the case that matters here.
    double mean = 0.0;
    for (int64_t j = 0; j < kv_len; ++j) mean += keys[j * head_dim + c];
    mean /= static_cast<double>(kv_len);
    double var = 0.0;
    for (int64_t j = 0; j < kv_len; ++j) {
      const double x = keys[j * head_dim + c] - mean;
      var += x * x;
    }
    const double spread = std::sqrt(var / static_cast<double>(kv_len));
    const bool centre = policy == CentringPolicy::kAlways || std::abs(mean) > kCentringOffsetSpreadRatio * spread;
    if (centre) kbar[c] = round_to_grid(static_cast<float>(mean));
  }
}

CentredKeys centre_keys(const AttentionInputs& in, const SavedForward& saved, CentringPolicy policy) {
  in.validate();
  const AttentionShape& sh = in.shape;
  const int64_t d = sh.head_dim;
  if (static_cast<int64_t>(saved.lse.size()) != sh.q_rows()) {
    throw std::invalid_argument("saved lse must be (B, Hq, N)");
  }
  CentredKeys c;
  c.k = in.k;
  c.lse = saved.lse;
  c.kbar.assign(sh.batch * sh.kv_heads * d, 0.0f);
  for (int64_t b = 0; b < sh.batch; ++b) {
    for (int64_t hk = 0; hk < sh.kv_heads; ++hk) {
      float* kbar = &c.kbar[(b * sh.kv_heads + hk) * d];
      choose_kbar(&in.k[sh.kv_offset(b, hk, 0)], sh.kv_len, d, policy, &round_bf16, kbar);
      float* k0 = &c.k[sh.kv_offset(b, hk, 0)];
      for (int64_t j = 0; j < sh.kv_len; ++j) {
        for (int64_t x = 0; x < d; ++x) k0[j * d + x] = round_bf16(k0[j * d + x] - kbar[x]);
      }
      for (int64_t h = hk * sh.group(); h < (hk + 1) * sh.group(); ++h) {
        for (int64_t n = 0; n < sh.q_len; ++n) {
          float& lse = c.lse[sh.lse_offset(b, h, n)];
          if (!std::isfinite(lse)) continue;
          lse -= static_cast<float>(in.scale) * dot<float>(&in.q[sh.q_offset(b, h, n)], kbar, d);
        }
      }
    }
  }
  return c;
}

Gradients backward_center_bf16(const AttentionInputs& in, const SavedForward& saved, CentringPolicy policy) {
  CentredKeys centred = centre_keys(in, saved, policy);
  AttentionInputs shifted = in;
  shifted.k = std::move(centred.k);
  const SavedForward shifted_saved{saved.out, std::move(centred.lse)};
  return backward_fused_bf16(shifted, shifted_saved).plain;
}

}  // namespace gaugewatch::reference
