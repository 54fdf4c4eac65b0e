#pragma once
// Key centring (docs/numerics.md, "Key centring"): the softmax is invariant to a
// common key translation, so a stock backward run on (Q, K - kbar, V, O,
// lse - alpha q.kbar) returns the same gradients mathematically, while the
// rounded row mass rho_i of the fused BF16 backward multiplies the centred keys
// (leak alpha rho_i (mu_i - kbar) instead of alpha rho_i mu_i).
//
// kbar is chosen per (batch, key/value head) and coordinate c from the keys'
// mean m_c and RMS deviation s_c over all M keys:
//   centre c  <=>  policy "always", or "auto" and |m_c| > kCentringOffsetSpreadRatio * s_c
//   kbar_c    =    round(m_c) on the keys' grid where c is centred, else 0.
// Why this criterion: both error terms are rounding-sized. Leaving c alone
// costs rho_i m_c (rho_i ~ u_b |t_i|); centring it costs the rounding of
// k_jc - kbar_c (up to u_b / 2 |k_jc - kbar_c|, about u_b s_c / 2) wherever
// the difference is inexact. So centring c pays only where the offset clearly
// exceeds the spread; and there every key with |k_jc - kbar_c| <= |kbar_c| / 2
// subtracts exactly (Sterbenz), so K - kbar is exact where the offset
// dominates. Where keys are not offset (|m_c| ~ s_c / sqrt(M) for random keys)
// "auto" leaves kbar = 0: nothing is rounded and the stock result is kept.

#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/reference/attention_problem.h"
#include "kernels/reference/fused_backward_bf16.h"

namespace gaugewatch::reference {

enum class CentringPolicy { kAuto, kAlways, kNever };

// "auto", "always", "never"; throws std::invalid_argument otherwise.
CentringPolicy parse_centring_policy(std::string_view text);
std::string_view to_string(CentringPolicy policy);

// A coordinate is centred by "auto" when |mean| exceeds this many RMS deviations.
inline constexpr double kCentringOffsetSpreadRatio = 2.0;

// Rounds a float to the grid of the keys' dtype (BF16, FP16 or FP32).
using GridRounding = float (*)(float);

// kbar (d values) of one (batch, key/value head): keys are M rows of d floats.
void choose_kbar(const float* keys, int64_t kv_len, int64_t head_dim, CentringPolicy policy,
                 GridRounding round_to_grid, float* kbar);

// The centred operands of a whole call on the BF16 grid.
struct CentredKeys {
  std::vector<float> k;     // (B, Hkv, M, d): round_bf16(k - kbar)
  std::vector<float> lse;   // (B, Hq, N): lse - alpha q.kbar in FP32 (non-finite entries kept)
  std::vector<float> kbar;  // (B, Hkv, d)
};

CentredKeys centre_keys(const AttentionInputs& in, const SavedForward& saved, CentringPolicy policy);

// Backend "center": the stock fused BF16 backward (the plain emulation of
// fused_backward_bf16.h, BF16 outputs) on (Q, K - kbar, V, O, lse - alpha q.kbar).
Gradients backward_center_bf16(const AttentionInputs& in, const SavedForward& saved,
                               CentringPolicy policy = CentringPolicy::kAuto);

}  // namespace gaugewatch::reference
