#include "kernels/reference/fp32_backward.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/reference/row_sweep.h"
#include "kernels/reference/vector_math.h"

namespace gaugewatch::reference {

namespace {

struct Accumulator {
  std::vector<float> dk, dv;  // (M, d) partial sums
  std::vector<float> p, a;    // one row's probabilities and dP
};

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
  const AttentionShape& sh = in.shape;
  const int64_t d = sh.head_dim;
  const int64_t md = sh.kv_len * d;
  const float alpha = static_cast<float>(in.scale);
  const std::vector<float> centered = options.center_keys ? centered_keys(in) : std::vector<float>{};
  const std::vector<float>& keys_used = options.center_keys ? centered : in.k;

  Gradients g;
  g.dq.assign(sh.q_elements(), 0.0f);
  g.dk.assign(sh.kv_elements(), 0.0f);
  g.dv.assign(sh.kv_elements(), 0.0f);

  auto make = [&] {
    Accumulator acc;
    acc.dk.assign(md, 0.0f);
    acc.dv.assign(md, 0.0f);
    acc.p.resize(sh.kv_len);
    acc.a.resize(sh.kv_len);
    return acc;
  };
  auto row = [&](Accumulator& acc, int64_t b, int64_t h, int64_t n) {
    const KeyRange keys = visible_keys(in, n);
    if (keys.size() == 0) return;
    const int64_t hk = h / sh.group();
    const float* q = &in.q[sh.q_offset(b, h, n)];
    const float* u = &in.grad_out[sh.q_offset(b, h, n)];
    const float* k0 = &keys_used[sh.kv_offset(b, hk, 0)];
    const float* v0 = &in.v[sh.kv_offset(b, hk, 0)];
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      acc.p[j] = alpha * dot<float>(q, k0 + j * d, d);
      mx = std::max(mx, acc.p[j]);
    }
    float l = 0.0f;
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      acc.p[j] = std::exp(acc.p[j] - mx);
      l += acc.p[j];
    }
    float delta = 0.0f;
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      acc.p[j] /= l;
      acc.a[j] = dot<float>(u, v0 + j * d, d);
      delta += acc.p[j] * acc.a[j];  // sum_j P dP: no saved output involved
    }
    float* dq = &g.dq[sh.q_offset(b, h, n)];
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      const float gs = acc.p[j] * (acc.a[j] - delta);
      axpy(alpha * gs, k0 + j * d, dq, d);
      axpy(alpha * gs, q, &acc.dk[j * d], d);
      axpy(acc.p[j], u, &acc.dv[j * d], d);
    }
  };
  auto fold = [&](Accumulator& acc, int64_t b, int64_t hk) {
    float* dk = &g.dk[sh.kv_offset(b, hk, 0)];
    float* dv = &g.dv[sh.kv_offset(b, hk, 0)];
    for (int64_t i = 0; i < md; ++i) {
      dk[i] += acc.dk[i];
      dv[i] += acc.dv[i];
    }
  };
  sweep_rows(sh, make, row, fold);
  return g;
}

}  // namespace gaugewatch::reference
