#include "kernels/torch/attention_call.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <string>
#include <utility>

namespace gaugewatch::torch_ops {

Backend parse_backend(c10::string_view name) {
  const std::string_view text(name.data(), name.size());
  const auto backend = gaugewatch::parse_backend(text);
  TORCH_CHECK(backend.has_value() && backend_spec(*backend).op, "gaugewatch: unknown backend '", std::string(text),
              "': use ", backend_names([](const BackendSpec& s) { return s.op; }), " (fp64 on CPU only, for tests)");
  return *backend;
}

const char* backend_name(Backend backend) { return gaugewatch::backend_name(backend).data(); }

c10::ScalarType backend_dtype(Backend backend) {
  switch (backend_spec(backend).output) {
    case OutputDtype::kFloat32: return at::kFloat;
    case OutputDtype::kFloat64: return at::kDouble;
    case OutputDtype::kBfloat16: break;
  }
  return at::kBFloat16;
}

namespace {

void check_dtype(const at::Tensor& t, c10::ScalarType want, const char* name, const char* why) {
  TORCH_CHECK(t.scalar_type() == want, "gaugewatch: ", name, " must be ", c10::toString(want), " (", why,
              "), got ", c10::toString(t.scalar_type()));
}

void check_offsets(const at::Tensor& t, const char* name, const at::Tensor& q) {
  TORCH_CHECK(t.dim() == 1, "gaugewatch: ", name, " must be 1-D (S + 1 offsets), got ", t.dim(), "-D");
  TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, "gaugewatch: ", name,
              " must be int32 or int64, got ", c10::toString(t.scalar_type()));
  TORCH_CHECK(t.device() == q.device() || t.device().is_cpu(), "gaugewatch: ", name, " is on ", t.device(),
              ", q on ", q.device());
}

}  // namespace

void check_operands(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& out, const at::Tensor& lse, c10::string_view causal_alignment,
                    const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k) {
  constexpr const char* kBf16Why = "the operands of a BF16 attention call";
  check_dtype(q, at::kBFloat16, "q", kBf16Why);
  check_dtype(k, at::kBFloat16, "k", kBf16Why);
  check_dtype(v, at::kBFloat16, "v", kBf16Why);
  check_dtype(out, at::kBFloat16, "out", kBf16Why);
  check_dtype(grad_out, at::kBFloat16, "grad_out", kBf16Why);
  check_dtype(lse, at::kFloat, "lse", "SDPA's flash op saves it in float32");
  TORCH_CHECK(q.dim() == 4, "gaugewatch: q must be 4-D (B, Hq, N, d) in SDPA layout, got ", q.dim(), "-D");
  TORCH_CHECK(k.dim() == 4, "gaugewatch: k must be 4-D (B, Hkv, M, d) in SDPA layout, got ", k.dim(), "-D");
  for (const auto& [t, name] : {std::pair{&v, "v"}, std::pair{&out, "out"}, std::pair{&grad_out, "grad_out"}}) {
    TORCH_CHECK(t->dim() == 4, "gaugewatch: ", name, " must be 4-D in SDPA layout, got ", t->dim(), "-D");
  }
  TORCH_CHECK(lse.dim() == 3, "gaugewatch: lse must be 3-D (B, Hq, N), got ", lse.dim(), "-D");
  for (const at::Tensor* t : {&k, &v, &out, &grad_out, &lse}) {
    TORCH_CHECK(t->device() == q.device(), "gaugewatch: every tensor must be on q's device ", q.device(),
                ", got one on ", t->device());
  }
  const std::string alignment(causal_alignment.data(), causal_alignment.size());
  TORCH_CHECK(alignment == "top_left" || alignment == "bottom_right", "gaugewatch: causal_alignment must be ",
              "'top_left' (SDPA is_causal) or 'bottom_right' (FlashAttention causal), got '", alignment, "'");
  TORCH_CHECK(cu_seqlens_q.has_value() == cu_seqlens_k.has_value(),
              "gaugewatch: packed sequences need both cu_seqlens_q and cu_seqlens_k");
  if (cu_seqlens_q.has_value()) {
    check_offsets(*cu_seqlens_q, "cu_seqlens_q", q);
    check_offsets(*cu_seqlens_k, "cu_seqlens_k", q);
  }
}

AttentionCall check_attention_call(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                   bool is_causal, std::optional<double> scale, c10::string_view causal_alignment,
                                   const std::optional<at::Tensor>& cu_seqlens_q,
                                   const std::optional<at::Tensor>& cu_seqlens_k) {
  check_operands(grad_out, q, k, v, out, lse, causal_alignment, cu_seqlens_q, cu_seqlens_k);
  TORCH_CHECK(v.sizes() == k.sizes(), "gaugewatch: v must have k's shape ", k.sizes(), ", got ", v.sizes());
  TORCH_CHECK(grad_out.sizes() == q.sizes(), "gaugewatch: grad_out must have q's shape ", q.sizes(), ", got ",
              grad_out.sizes());
  TORCH_CHECK(out.sizes() == q.sizes(), "gaugewatch: out must have q's shape ", q.sizes(), ", got ", out.sizes());
  TORCH_CHECK(k.size(0) == q.size(0), "gaugewatch: q and k must have the same batch size, got ", q.size(0),
              " and ", k.size(0));
  TORCH_CHECK(k.size(3) == q.size(3), "gaugewatch: q and k must have the same head dim, got ", q.size(3), " and ",
              k.size(3));
  TORCH_CHECK(lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
              "gaugewatch: lse must be (B, Hq, N) = (", q.size(0), ", ", q.size(1), ", ", q.size(2), "), got ",
              lse.sizes());

  AttentionCall call;
  auto& s = call.shape;
  s.batch = q.size(0);
  s.q_heads = q.size(1);
  s.q_len = q.size(2);
  s.head_dim = q.size(3);
  s.kv_heads = k.size(1);
  s.kv_len = k.size(2);
  TORCH_CHECK(s.batch >= 1 && s.q_heads >= 1 && s.kv_heads >= 1 && s.q_len >= 1 && s.kv_len >= 1 && s.head_dim >= 1,
              "gaugewatch: every dimension (B, Hq, Hkv, N, M, d) must be >= 1, got q ", q.sizes(), ", k ",
              k.sizes());
  TORCH_CHECK(s.q_heads % s.kv_heads == 0, "gaugewatch: GQA needs key/value heads to divide query heads; got Hq=",
              s.q_heads, ", Hkv=", s.kv_heads);
  const bool top_left = causal_alignment == "top_left";
  call.causal = !is_causal ? reference::CausalMode::kNone
                           : (top_left ? reference::CausalMode::kTopLeft : reference::CausalMode::kBottomRight);
  call.scale = scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  TORCH_CHECK(std::isfinite(call.scale), "gaugewatch: scale must be finite, got ", call.scale);
  if (cu_seqlens_q.has_value()) {
    TORCH_CHECK(cu_seqlens_q->numel() >= 2, "gaugewatch: cu_seqlens need at least 2 offsets (S + 1 for S segments)");
    TORCH_CHECK(cu_seqlens_q->numel() == cu_seqlens_k->numel(),
                "gaugewatch: cu_seqlens_q and cu_seqlens_k must have the same number of segments, got ",
                cu_seqlens_q->numel(), " and ", cu_seqlens_k->numel(), " offsets");
    call.packed = true;
  }
  return call;
}

void check_row_subset_operands(const at::Tensor& slices, const at::Tensor& rows, const at::Tensor& q) {
  for (const auto& [t, name] : {std::pair{&slices, "slices"}, std::pair{&rows, "rows"}}) {
    TORCH_CHECK(t->dim() == 1, "gaugewatch: ", name, " must be 1-D, got ", t->dim(), "-D");
    TORCH_CHECK(t->scalar_type() == at::kInt || t->scalar_type() == at::kLong, "gaugewatch: ", name,
                " must be int32 or int64, got ", c10::toString(t->scalar_type()));
    TORCH_CHECK(t->device() == q.device(), "gaugewatch: ", name, " must be on q's device ", q.device());
  }
}

void check_row_subset(const AttentionCall& call, const at::Tensor& slices, const at::Tensor& rows,
                      const at::Tensor& q) {
  check_row_subset_operands(slices, rows, q);
  if (slices.device().is_cpu()) {
    const auto s = slices.to(at::kLong);
    const auto r = rows.to(at::kLong);
    const int64_t slice_limit = call.shape.batch * call.shape.q_heads;
    TORCH_CHECK(s.numel() == 0 || (s.min().item<int64_t>() >= 0 && s.max().item<int64_t>() < slice_limit),
                "gaugewatch: slices are flat b * Hq + h indices in [0, ", slice_limit, ")");
    TORCH_CHECK(r.numel() == 0 || (r.min().item<int64_t>() >= 0 && r.max().item<int64_t>() < call.shape.q_len),
                "gaugewatch: rows are query rows in [0, N = ", call.shape.q_len, ")");
    // A repeated slice or row would count its dk/dv contribution twice.
    TORCH_CHECK(std::get<0>(at::_unique(s)).numel() == s.numel(), "gaugewatch: slices must be distinct");
    TORCH_CHECK(std::get<0>(at::_unique(r)).numel() == r.numel(), "gaugewatch: rows must be distinct");
  }
}

}  // namespace gaugewatch::torch_ops
