#pragma once
// The unfused attention forward + backward that both the FP64 truth
// (exact_attention.cpp) and the FP32 recompute (fp32_backward.cpp) are: one
// template, instantiated in double and in float. Per visible row:
//   s_j = alpha q.k_j + bias_j, p = softmax(s) (row max subtracted), a_j = u.v_j,
//   delta = sum_j p_j a_j (no saved output), g_j = p_j (a_j - delta),
//   dq += alpha g_j k_j, dk_j += alpha g_j q, dv_j += p_j u, o += p_j v_j.
// Internal to the reference; callers use attention_fp64() / backward_fp32().

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/reference/attention_problem.h"
#include "kernels/reference/row_sweep.h"
#include "kernels/reference/vector_math.h"

namespace gaugewatch::reference::detail {

template <typename T>
struct SoftmaxAttention {
  std::vector<T> out, lse;  // only when asked for
  std::vector<T> dq, dk, dv;
  // Largest |sum_j g_ij| relative to sum_j p_ij |a_ij| (the terms that cancel).
  double max_relative_row_sum = 0.0;
};

// `keys` is in.k or a translated copy of it (same layout).
template <typename T>
SoftmaxAttention<T> softmax_attention(const AttentionInputs& in, const std::vector<float>& keys, bool with_forward) {
  const AttentionShape& sh = in.shape;
  const int64_t d = sh.head_dim;
  const int64_t md = sh.kv_len * d;
  const T alpha = static_cast<T>(in.scale);
  SoftmaxAttention<T> r;
  if (with_forward) {
    r.out.assign(sh.q_elements(), T(0));
    r.lse.assign(sh.q_rows(), std::numeric_limits<T>::infinity());
  }
  r.dq.assign(sh.q_elements(), T(0));
  r.dk.assign(sh.kv_elements(), T(0));
  r.dv.assign(sh.kv_elements(), T(0));

  struct Accumulator {
    std::vector<T> dk, dv;  // (M, d) partial sums of one key/value head
    std::vector<T> p, a;    // one row's probabilities and dP
    double max_relative_row_sum = 0.0;
  };
  auto make = [&] {
    Accumulator acc;
    acc.dk.assign(md, T(0));
    acc.dv.assign(md, T(0));
    acc.p.resize(sh.kv_len);
    acc.a.resize(sh.kv_len);
    return acc;
  };
  auto row = [&](Accumulator& acc, int64_t b, int64_t h, int64_t n) {
    const KeyRange visible = visible_keys(in, n);
    if (visible.size() == 0) return;  // out = 0, lse = +inf, no gradient
    const BiasRow bias = in.bias_row(b, h, n);
    const int64_t hk = h / sh.group();
    const int64_t qo = sh.q_offset(b, h, n);
    const float* q = &in.q[qo];
    const float* u = &in.grad_out[qo];
    const float* k0 = &keys[sh.kv_offset(b, hk, 0)];
    const float* v0 = &in.v[sh.kv_offset(b, hk, 0)];
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = visible.begin; j < visible.end; ++j) {
      acc.p[j] = alpha * dot<T>(q, k0 + j * d, d) + static_cast<T>(bias[j]);
      mx = std::max(mx, acc.p[j]);
    }
    // Every visible key masked out: as no key (SDPA gives 0 output and gradients).
    if (mx == -std::numeric_limits<T>::infinity()) return;
    T l = T(0);
    for (int64_t j = visible.begin; j < visible.end; ++j) {
      acc.p[j] = std::exp(acc.p[j] - mx);
      l += acc.p[j];
    }
    if (with_forward) r.lse[sh.lse_offset(b, h, n)] = mx + std::log(l);
    T delta = T(0);
    for (int64_t j = visible.begin; j < visible.end; ++j) {
      acc.p[j] /= l;
      if (with_forward) axpy(acc.p[j], v0 + j * d, &r.out[qo], d);
      acc.a[j] = dot<T>(u, v0 + j * d, d);
      delta += acc.p[j] * acc.a[j];
    }
    T* dq = &r.dq[qo];
    double row_sum = 0.0, row_scale = 0.0;
    for (int64_t j = visible.begin; j < visible.end; ++j) {
      const T g = acc.p[j] * (acc.a[j] - delta);
      row_sum += static_cast<double>(g);
      row_scale += static_cast<double>(acc.p[j]) * std::abs(static_cast<double>(acc.a[j]));
      axpy(alpha * g, k0 + j * d, dq, d);
      axpy(alpha * g, q, &acc.dk[j * d], d);
      axpy(acc.p[j], u, &acc.dv[j * d], d);
    }
    if (row_scale > 0) {
      acc.max_relative_row_sum = std::max(acc.max_relative_row_sum, std::abs(row_sum) / row_scale);
    }
  };
  auto fold = [&](Accumulator& acc, int64_t b, int64_t hk) {
    T* dk = &r.dk[sh.kv_offset(b, hk, 0)];
    T* dv = &r.dv[sh.kv_offset(b, hk, 0)];
    for (int64_t i = 0; i < md; ++i) {
      dk[i] += acc.dk[i];
      dv[i] += acc.dv[i];
    }
    r.max_relative_row_sum = std::max(r.max_relative_row_sum, acc.max_relative_row_sum);
  };
  sweep_rows(sh, make, row, fold);
  return r;
}

}  // namespace gaugewatch::reference::detail
