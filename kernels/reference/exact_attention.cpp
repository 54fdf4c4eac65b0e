#include "kernels/reference/exact_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/reference/row_sweep.h"
#include "kernels/reference/vector_math.h"

namespace gaugewatch::reference {

namespace {

struct Accumulator {
  std::vector<double> dk, dv;             // (M, d) of one key/value head
  std::vector<double> s, a;               // one row's scores and dP
  double max_relative_row_sum = 0.0;
};

}  // namespace

ExactAttention attention_fp64(const AttentionInputs& in) {
  in.validate();
  const AttentionShape& sh = in.shape;
  const int64_t d = sh.head_dim;
  const int64_t md = sh.kv_len * d;
  ExactAttention result;
  result.out.assign(sh.q_elements(), 0.0);
  result.lse.assign(sh.q_rows(), std::numeric_limits<double>::infinity());
  result.dq.assign(sh.q_elements(), 0.0);
  result.dk.assign(sh.kv_elements(), 0.0);
  result.dv.assign(sh.kv_elements(), 0.0);
  const double alpha = in.scale;

  auto make = [&] {
    Accumulator acc;
    acc.dk.assign(md, 0.0);
    acc.dv.assign(md, 0.0);
    acc.s.resize(sh.kv_len);
    acc.a.resize(sh.kv_len);
    return acc;
  };
  auto row = [&](Accumulator& acc, int64_t b, int64_t h, int64_t n) {
    const KeyRange keys = visible_keys(in, n);
    if (keys.size() == 0) return;  // out = 0, lse = +inf, no gradient
    const int64_t hk = h / sh.group();
    const float* q = &in.q[sh.q_offset(b, h, n)];
    const float* u = &in.grad_out[sh.q_offset(b, h, n)];
    const float* k0 = &in.k[sh.kv_offset(b, hk, 0)];
    const float* v0 = &in.v[sh.kv_offset(b, hk, 0)];

    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      acc.s[j] = alpha * dot<double>(q, k0 + j * d, d);
      mx = std::max(mx, acc.s[j]);
    }
    double l = 0.0;
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      acc.s[j] = std::exp(acc.s[j] - mx);  // s now holds unnormalized p
      l += acc.s[j];
    }
    result.lse[sh.lse_offset(b, h, n)] = mx + std::log(l);
    double* o = &result.out[sh.q_offset(b, h, n)];
    double delta = 0.0;
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      acc.s[j] /= l;  // p_ij
      axpy(acc.s[j], v0 + j * d, o, d);
      acc.a[j] = dot<double>(u, v0 + j * d, d);
      delta += acc.s[j] * acc.a[j];
    }
    double* dq = &result.dq[sh.q_offset(b, h, n)];
    // sum_j g_ij cancels terms of size sum_j p_ij |a_ij|: measure against that.
    double row_sum = 0.0, row_abs = 0.0;
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      const double p = acc.s[j];
      const double g = p * (acc.a[j] - delta);
      row_sum += g;
      row_abs += p * std::abs(acc.a[j]);
      axpy(alpha * g, k0 + j * d, dq, d);
      axpy(alpha * g, q, &acc.dk[j * d], d);
      axpy(p, u, &acc.dv[j * d], d);
    }
    if (row_abs > 0) {
      acc.max_relative_row_sum = std::max(acc.max_relative_row_sum, std::abs(row_sum) / row_abs);
    }
  };
  auto fold = [&](Accumulator& acc, int64_t b, int64_t hk) {
    double* dk = &result.dk[sh.kv_offset(b, hk, 0)];
    double* dv = &result.dv[sh.kv_offset(b, hk, 0)];
    for (int64_t i = 0; i < md; ++i) {
      dk[i] += acc.dk[i];
      dv[i] += acc.dv[i];
    }
    result.max_relative_row_sum = std::max(result.max_relative_row_sum, acc.max_relative_row_sum);
  };
  sweep_rows(sh, make, row, fold);
  return result;
}

}  // namespace gaugewatch::reference
