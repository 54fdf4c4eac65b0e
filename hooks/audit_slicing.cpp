#include "hooks/audit_slicing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace gaugewatch::hooks {
namespace {

// Selects the audited (batch, head) slices and query rows: slices rotate with
// the step; rows are the last max_rows (bottom-right causal alignment, which
// equals SDPA's top-left one when N == M), or the first ones when N != M.
struct Selection {
  at::Tensor q_index, kv_index;  // flat b * H + h
  std::int64_t row0 = 0, rows = 0;
  std::string alignment = "top_left";
  bool all_rows = true;
};

Selection select(const AuditCall& c, const BackwardPlan& plan) {
  const std::int64_t B = c.q.size(0), Hq = c.q.size(1), N = c.q.size(2), Hkv = c.k.size(1), M = c.k.size(2);
  const std::int64_t slices = B * Hq;
  const std::int64_t S = std::min<std::int64_t>(plan.max_heads, slices);
  const std::int64_t first = static_cast<std::int64_t>(plan.step % static_cast<std::uint64_t>(slices));
  const auto opts = at::TensorOptions().dtype(at::kLong);
  Selection sel;
  at::Tensor idx = (at::arange(S, opts) * std::max<std::int64_t>(1, slices / S) + first).remainder(slices);
  sel.q_index = idx;
  sel.kv_index = idx.div(Hq, "floor") * Hkv + idx.remainder(Hq).div(Hq / Hkv, "floor");
  sel.rows = std::min<std::int64_t>(plan.max_rows, N);
  sel.all_rows = sel.rows == N;
  if (!sel.all_rows && (N == M || !c.is_causal)) {
    sel.row0 = N - sel.rows;
    if (c.is_causal) sel.alignment = "bottom_right";
  }
  return sel;
}

// (B, H, L, d) -> the chosen slices (S, 1, L', d), contiguous. `index` is on t's device.
at::Tensor take(const at::Tensor& t, const at::Tensor& index, std::int64_t row0, std::int64_t rows) {
  const at::Tensor flat = t.reshape({t.size(0) * t.size(1), t.size(2), t.size(3)});
  at::Tensor s = flat.index_select(0, index);
  if (rows >= 0) s = s.narrow(1, row0, rows);
  return s.unsqueeze(1).contiguous();
}

at::Tensor take_lse(const at::Tensor& t, const at::Tensor& index, std::int64_t row0, std::int64_t rows) {
  const at::Tensor flat = t.reshape({t.size(0) * t.size(1), t.size(2)});
  return flat.index_select(0, index).narrow(1, row0, rows).unsqueeze(1).contiguous();
}

}  // namespace

void fill_job(Job& job, const AuditCall& c, const BackwardPlan& plan) {
  Selection sel = select(c, plan);
  // Once to the operands' device (a CUDA call: one small copy each, not one per tensor taken).
  sel.q_index = sel.q_index.to(c.q.device());
  sel.kv_index = sel.kv_index.to(c.q.device());
  job.alignment = sel.alignment;
  job.compare_dkdv = sel.all_rows && c.q.size(1) == c.k.size(1);
  job.slice.q = take(c.q, sel.q_index, sel.row0, sel.rows);
  job.slice.grad_out = take(c.grad_out, sel.q_index, sel.row0, sel.rows);
  job.slice.out = take(c.out, sel.q_index, sel.row0, sel.rows);
  job.slice.lse = take_lse(c.lse, sel.q_index, sel.row0, sel.rows);
  job.slice.k = take(c.k, sel.kv_index, 0, -1);
  job.slice.v = take(c.v, sel.kv_index, 0, -1);
  if (c.mask.defined()) {
    // The mask broadcast to (B, Hq, N, M) as a view; only the audited
    // (batch, head) slices and rows are gathered.
    const std::int64_t Hq = c.q.size(1);
    const at::Tensor full = c.mask.expand({c.q.size(0), Hq, c.q.size(2), c.k.size(2)});
    const at::Tensor b = sel.q_index.div(Hq, "floor"), h = sel.q_index.remainder(Hq);
    job.slice.mask = full.index({b, h}).narrow(1, sel.row0, sel.rows).unsqueeze(1).contiguous();
  }
  job.live_dq = take(c.dq, sel.q_index, sel.row0, sel.rows);
  if (job.compare_dkdv) {
    job.live_dk = take(c.dk, sel.kv_index, 0, -1);
    job.live_dv = take(c.dv, sel.kv_index, 0, -1);
  }
}

void fill_shape(SampleData& s, const AuditCall& c) {
  s.batch = static_cast<std::uint32_t>(c.q.size(0));
  s.query_heads = static_cast<std::uint32_t>(c.q.size(1));
  s.key_value_heads = static_cast<std::uint32_t>(c.k.size(1));
  s.query_len = static_cast<std::uint32_t>(c.q.size(2));
  s.key_len = static_cast<std::uint32_t>(c.k.size(2));
  s.head_dim = static_cast<std::uint32_t>(c.q.size(3));
  s.is_causal = c.is_causal;
  s.dtype = c.q.scalar_type() == at::kBFloat16 ? "bfloat16" : c.q.scalar_type() == at::kHalf ? "float16" : "float32";
}

std::uint64_t slice_bytes(const AuditCall& c, const BackwardPlan& plan) {
  // Slices of q, grad_out, out, the live dq: max_rows rows each; of k, v, the live dk, dv: every key;
  // of the mask: max_rows rows of every key.
  const std::int64_t S = std::min<std::int64_t>(plan.max_heads, c.q.size(0) * c.q.size(1));
  const std::int64_t R = std::min<std::int64_t>(plan.max_rows, c.q.size(2));
  const std::int64_t mask = c.mask.defined() ? S * R * c.k.size(2) * static_cast<std::int64_t>(c.mask.element_size()) : 0;
  return static_cast<std::uint64_t>(S * (4 * R + 4 * c.k.size(2)) * c.q.size(3) * 2 + mask);
}

}  // namespace gaugewatch::hooks
