#include "kernels/reference/fused_backward_bf16.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/reference/bf16.h"
#include "kernels/reference/constants.h"
#include "kernels/reference/row_sweep.h"
#include "kernels/reference/vector_math.h"

namespace gaugewatch::reference {

namespace {

// FP32 partial sums over one chunk of query rows, for one key/value head.
struct Accumulator {
  std::vector<float> dk;        // sum_i t_ij q_i
  std::vector<float> dv;        // sum_i r_ij dO_i
  std::vector<float> gproj_dk;  // sum_i r_ij lambda_i q_i
  std::vector<float> pivot_dk;  // sum_{i: j*(i)=j} rho_i q_i
  std::vector<float> t, r;      // one row's operands
  std::vector<float> dq, u_r, lq;  // one row's sum t K, sum r K, lambda q
};

void resize_gradients(Gradients& g, const AttentionShape& sh) {
  g.dq.assign(sh.q_elements(), 0.0f);
  g.dk.assign(sh.kv_elements(), 0.0f);
  g.dv.assign(sh.kv_elements(), 0.0f);
}

}  // namespace

FusedBackward backward_fused_bf16(const AttentionInputs& in, const SavedForward& saved,
                                  const FusedBackwardOptions& options) {
  in.validate();
  const AttentionShape& sh = in.shape;
  if (static_cast<int64_t>(saved.out.size()) != sh.q_elements() ||
      static_cast<int64_t>(saved.lse.size()) != sh.q_rows()) {
    throw std::invalid_argument("saved out must be (B, Hq, N, d) and lse (B, Hq, N)");
  }
  const int64_t d = sh.head_dim;
  const int64_t md = sh.kv_len * d;
  const float alpha = static_cast<float>(in.scale);
  const float scale_log2 = alpha * kLog2e;
  auto finish = [&](float x) { return options.round_outputs ? round_bf16(x) : x; };

  FusedBackward result;
  resize_gradients(result.plain, sh);
  resize_gradients(result.gproj, sh);
  resize_gradients(result.pivot, sh);
  RowDiagnostics& rows = result.rows;
  rows.row_mass.assign(sh.q_rows(), 0.0f);
  rows.prob_mass.assign(sh.q_rows(), 0.0f);
  rows.abs_row_mass.assign(sh.q_rows(), 0.0f);
  rows.p_max.assign(sh.q_rows(), 0.0f);
  rows.pivot.assign(sh.q_rows(), -1);
  rows.logit_abs_max.assign(sh.q_rows(), 0.0f);

  auto make = [&] {
    Accumulator acc;
    for (auto* v : {&acc.dk, &acc.dv, &acc.gproj_dk, &acc.pivot_dk}) v->assign(md, 0.0f);
    acc.t.resize(sh.kv_len);
    acc.r.resize(sh.kv_len);
    for (auto* v : {&acc.dq, &acc.u_r, &acc.lq}) v->resize(d);
    return acc;
  };

  auto row = [&](Accumulator& acc, int64_t b, int64_t h, int64_t n) {
    const KeyRange keys = visible_keys(in, n);
    if (keys.size() == 0 || !sees_a_key(in, b, h, n)) return;
    const float lse_log2 = saved.lse[sh.lse_offset(b, h, n)] * kLog2e;
    const BiasRow bias = in.bias_row(b, h, n);
    // P_ij = exp2(S_ij alpha log2e + bias_ij log2e - lse_i log2e); without a
    // mask the bias term is 0 and the exponent is the plain kernels' fma.
    auto probability = [&](float s, int64_t j) {
      return std::exp2(std::fma(s, scale_log2, bias.empty() ? -lse_log2 : std::fma(bias[j], kLog2e, -lse_log2)));
    };
    const int64_t hk = h / sh.group();
    const int64_t qo = sh.q_offset(b, h, n);
    const int64_t ro = sh.lse_offset(b, h, n);
    const float* q = &in.q[qo];
    const float* du = &in.grad_out[qo];
    const float* k0 = &in.k[sh.kv_offset(b, hk, 0)];
    const float* v0 = &in.v[sh.kv_offset(b, hk, 0)];

    float delta = 0.0f;
    if (options.delta_source == DeltaSource::kSavedOutput) {
      delta = dot<float>(du, &saved.out[qo], d);
    } else {
      for (int64_t j = keys.begin; j < keys.end; ++j) {
        const float p = probability(dot<float>(q, k0 + j * d, d), j);
        delta += p * dot<float>(du, v0 + j * d, d);
      }
    }
    float rho = 0.0f, m = 0.0f, abs_mass = 0.0f, p_max = -1.0f, logit_max = 0.0f;
    int64_t pivot = -1;
    std::fill(acc.dq.begin(), acc.dq.end(), 0.0f);
    std::fill(acc.u_r.begin(), acc.u_r.end(), 0.0f);
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      const float* kj = k0 + j * d;
      const float s = dot<float>(q, kj, d);
      const float p = probability(s, j);
      const float dp = dot<float>(du, v0 + j * d, d);
      const float t = round_bf16(p * (dp - delta));
      const float r = round_bf16(p);
      acc.t[j] = t;
      acc.r[j] = r;
      rho += t;
      m += r;
      abs_mass += std::abs(t);
      if (p > p_max) {  // strict: ties keep the lower j
        p_max = p;
        pivot = j;
      }
      if (bias.keeps(j)) logit_max = std::max(logit_max, std::abs(s * alpha + bias[j]));
      axpy(t, kj, acc.dq.data(), d);         // GEMM 5: t K
      axpy(r, kj, acc.u_r.data(), d);        // GEMM 6: r K (GProj)
      axpy(t, q, &acc.dk[j * d], d);         // GEMM 4: t^T Q
      axpy(r, du, &acc.dv[j * d], d);        // GEMM 2: r^T dO
    }
    // lambda = rho / m; m > 0 whenever a key is visible (the row max has P ~ 1).
    const float lambda = m > 0.0f ? rho / m : 0.0f;
    for (int64_t c = 0; c < d; ++c) acc.lq[c] = lambda * q[c];
    for (int64_t j = keys.begin; j < keys.end; ++j) {
      axpy(acc.r[j], acc.lq.data(), &acc.gproj_dk[j * d], d);  // pass 2: r^T (lambda Q)
    }
    // The pivot fix-up, O(d) per row. No pivot when every P of the row is NaN
    // (NaN operands): the row's gradients are NaN anyway, and nothing may be
    // written outside the tensors.
    if (pivot >= 0) axpy(rho, q, &acc.pivot_dk[pivot * d], d);

    const float* k_pivot = pivot >= 0 ? k0 + pivot * d : nullptr;
    float* dq_plain = &result.plain.dq[qo];
    float* dq_gproj = &result.gproj.dq[qo];
    float* dq_pivot = &result.pivot.dq[qo];
    for (int64_t c = 0; c < d; ++c) {
      dq_plain[c] = finish(alpha * acc.dq[c]);
      dq_gproj[c] = finish(alpha * (acc.dq[c] - lambda * acc.u_r[c]));
      dq_pivot[c] = finish(alpha * (acc.dq[c] - (k_pivot != nullptr ? rho * k_pivot[c] : 0.0f)));
    }
    rows.row_mass[ro] = rho;
    rows.prob_mass[ro] = m;
    rows.abs_row_mass[ro] = abs_mass;
    rows.p_max[ro] = p_max;
    rows.pivot[ro] = pivot;
    rows.logit_abs_max[ro] = logit_max;
  };

  // FP32 partials are summed across chunks first and rounded once at the end,
  // as a kernel that keeps dK in FP32 until its epilogue does.
  std::vector<float> dk_sum(sh.kv_elements(), 0.0f), dv_sum(sh.kv_elements(), 0.0f);
  std::vector<float> gproj_sum(sh.kv_elements(), 0.0f), pivot_sum(sh.kv_elements(), 0.0f);
  auto fold = [&](Accumulator& acc, int64_t b, int64_t hk) {
    const int64_t base = sh.kv_offset(b, hk, 0);
    for (int64_t i = 0; i < md; ++i) {
      dk_sum[base + i] += acc.dk[i];
      dv_sum[base + i] += acc.dv[i];
      gproj_sum[base + i] += acc.gproj_dk[i];
      pivot_sum[base + i] += acc.pivot_dk[i];
    }
  };
  sweep_rows(sh, make, row, fold);

  for (int64_t i = 0; i < sh.kv_elements(); ++i) {
    result.plain.dk[i] = finish(alpha * dk_sum[i]);
    result.gproj.dk[i] = finish(alpha * (dk_sum[i] - gproj_sum[i]));
    result.pivot.dk[i] = finish(alpha * (dk_sum[i] - pivot_sum[i]));
    const float dv = finish(dv_sum[i]);
    result.plain.dv[i] = result.gproj.dv[i] = result.pivot.dv[i] = dv;
  }
  return result;
}

}  // namespace gaugewatch::reference
