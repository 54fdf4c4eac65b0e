// CUDA implementation of gaugewatch::attention_metrics (issue 3, item 3).
// Schema and semantics: kernels/torch/registration.cpp; the CPU op
// (ops_cpu.cpp) and kernels/reference/metrics.cpp define the values.
//
// Composition, all enqueued on the current CUDA stream (no host sync):
//   1. fused BF16 backward, no projection ("live" = backend bf16), with the row
//      diagnostics rho_i and sum_j |t_ij| the row-mass metrics need;
//   2. the same kernel with GProj;
//   3. the FP32 recompute (key-centred, deterministic: the reference every
//      discrepancy is measured against, as reference::backward_fp32(in));
//   4. gpu::translate_keys: b = -bf16(mean key) per kv head, K + b in BF16 and
//      lse + alpha q.b, exactly as reference::gauge_violation;
//   5. runs 1 and 2 again on the translated operands (dQ only is read);
//   6. gpu::attention_metrics reduces everything into kMetricCount values.
// Returns float64 (kMetricCount,) on the inputs' CUDA device, the same
// device/dtype convention as the CPU op (a tensor on the inputs' device) and
// the Meta kernel; a caller wanting host numbers calls .cpu() (the one sync).
// Medians are order statistics computed in the reduction kernels (radix
// select), so no torch sort is needed here.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "kernels/cuda/bf16_backward.h"
#include "kernels/cuda/fp32_backward.h"
#include "kernels/cuda/metrics.h"
#include "kernels/reference/metric_catalogue.h"
#include "kernels/torch/attention_call.h"
#include "kernels/torch/registration.h"

namespace gaugewatch::torch_ops {
namespace {

static_assert(gpu::kMetricCount == reference::kMetricCount);

gpu::CausalMode causal_of(reference::CausalMode mode) {
  switch (mode) {
    case reference::CausalMode::kTopLeft: return gpu::CausalMode::kTopLeft;
    case reference::CausalMode::kBottomRight: return gpu::CausalMode::kBottomRight;
    default: return gpu::CausalMode::kNone;
  }
}

// cu_seqlens as int32 on q's device; CPU offsets are checked here, device ones
// are trusted (the kernels clamp them), since checking would sync the stream.
at::Tensor offsets_on_device(const at::Tensor& t, int64_t length, const char* name, const at::Tensor& q) {
  if (t.device().is_cpu()) {
    const at::Tensor l = t.to(at::kLong).contiguous();
    const int64_t* p = l.data_ptr<int64_t>();
    const int64_t n = l.numel();
    TORCH_CHECK(p[0] == 0 && p[n - 1] == length, "gaugewatch: ", name, " must start at 0 and end at ", length,
                ", got ", p[0], " .. ", p[n - 1]);
    for (int64_t i = 1; i < n; ++i) TORCH_CHECK(p[i] >= p[i - 1], "gaugewatch: ", name, " must be non-decreasing");
  }
  return t.to(q.device(), at::kInt).contiguous();
}

const uint16_t* bf16_ptr(const at::Tensor& t) { return static_cast<const uint16_t*>(t.data_ptr()); }
uint16_t* bf16_mut(const at::Tensor& t) { return static_cast<uint16_t*>(t.data_ptr()); }
at::Tensor bytes_on(const at::Tensor& like, size_t bytes) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

struct Bf16Run {
  at::Tensor dq, dk, dv;
};

// The fused BF16 backward on contiguous operands; `diag` may be empty.
Bf16Run run_bf16(const AttentionCall& call, gpu::Projection projection, const at::Tensor& grad_out,
                 const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                 const at::Tensor& lse, const at::Tensor& cu_q, const at::Tensor& cu_k,
                 const gpu::Bf16RowDiagnostics& diag, cudaStream_t stream) {
  const auto& sh = call.shape;
  gpu::Bf16BackwardParams p;
  p.q = bf16_ptr(q);
  p.k = bf16_ptr(k);
  p.v = bf16_ptr(v);
  p.out = bf16_ptr(out);
  p.grad_out = bf16_ptr(grad_out);
  p.lse = lse.data_ptr<float>();
  Bf16Run r{at::empty(q.sizes(), q.options()), at::empty(k.sizes(), k.options()), at::empty(k.sizes(), k.options())};
  p.dq = bf16_mut(r.dq);
  p.dk = bf16_mut(r.dk);
  p.dv = bf16_mut(r.dv);
  p.batch = sh.batch;
  p.q_heads = sh.q_heads;
  p.kv_heads = sh.kv_heads;
  p.q_len = sh.q_len;
  p.kv_len = sh.kv_len;
  p.head_dim = sh.head_dim;
  p.scale = static_cast<float>(call.scale);
  p.causal = causal_of(call.causal);
  if (call.packed) {
    p.cu_seqlens_q = cu_q.data_ptr<int32_t>();
    p.cu_seqlens_k = cu_k.data_ptr<int32_t>();
    p.num_segments = cu_q.numel() - 1;
  }
  p.projection = projection;
  p.deterministic = true;
  p.diagnostics = diag;
  p.set_contiguous_strides();
  const size_t bytes = gpu::bf16_backward_workspace_bytes(p);
  const at::Tensor workspace = bytes_on(q, bytes);
  const gpu::Status status = gpu::bf16_attention_backward(p, workspace.data_ptr(), bytes, stream);
  TORCH_CHECK(status.ok(), "gaugewatch: attention_metrics: CUDA bf16 backward failed: ", status.message);
  return r;
}

at::Tensor attention_metrics_cuda(const at::Tensor& grad_out_arg, const at::Tensor& q_arg, const at::Tensor& k_arg,
                                  const at::Tensor& v_arg, const at::Tensor& out_arg, const at::Tensor& lse_arg,
                                  bool is_causal, std::optional<double> scale, c10::string_view causal_alignment,
                                  const std::optional<at::Tensor>& cu_seqlens_q,
                                  const std::optional<at::Tensor>& cu_seqlens_k) {
  const AttentionCall call = check_attention_call(grad_out_arg, q_arg, k_arg, v_arg, out_arg, lse_arg, is_causal,
                                                  scale, causal_alignment, cu_seqlens_q, cu_seqlens_k);
  const auto& sh = call.shape;
  TORCH_CHECK(sh.head_dim == 64 || sh.head_dim == 128,
              "gaugewatch: attention_metrics on CUDA runs the fused BF16 backward, which supports head dims 64 "
              "and 128, got ",
              sh.head_dim, "; pass CPU tensors for the reference metrics");
  const c10::cuda::CUDAGuard guard(q_arg.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();

  const at::Tensor q = q_arg.contiguous(), k = k_arg.contiguous(), v = v_arg.contiguous();
  const at::Tensor out = out_arg.contiguous(), grad_out = grad_out_arg.contiguous(), lse = lse_arg.contiguous();
  // FP32 copies (BF16 values are exact): the FP32 recompute's operands and
  // the geometry's.
  const at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat);
  const at::Tensor vf = v.to(at::kFloat), gf = grad_out.to(at::kFloat);
  at::Tensor cu_q, cu_k;
  if (call.packed) {
    cu_q = offsets_on_device(*cu_seqlens_q, sh.q_len, "cu_seqlens_q", q);
    cu_k = offsets_on_device(*cu_seqlens_k, sh.kv_len, "cu_seqlens_k", q);
  }

  // 1, 2: live (bf16) with row diagnostics, and gproj.
  const auto f32 = q.options().dtype(at::kFloat);
  const at::Tensor row_mass = at::empty(lse.sizes(), f32), abs_row_mass = at::empty(lse.sizes(), f32);
  gpu::Bf16RowDiagnostics diag;
  diag.row_mass = row_mass.data_ptr<float>();
  diag.abs_row_mass = abs_row_mass.data_ptr<float>();
  const Bf16Run live = run_bf16(call, gpu::Projection::kNone, grad_out, q, k, v, out, lse, cu_q, cu_k, diag, stream);
  const Bf16Run gproj = run_bf16(call, gpu::Projection::kGproj, grad_out, q, k, v, out, lse, cu_q, cu_k, {}, stream);

  // 3: the FP32 recompute, key-centred as reference::backward_fp32's default.
  gpu::Fp32BackwardParams fp;
  fp.q = qf.data_ptr<float>();
  fp.k = kf.data_ptr<float>();
  fp.v = vf.data_ptr<float>();
  fp.grad_out = gf.data_ptr<float>();
  const at::Tensor ref_dq = at::empty(q.sizes(), f32), ref_dk = at::empty(k.sizes(), f32),
                   ref_dv = at::empty(k.sizes(), f32);
  fp.dq = ref_dq.data_ptr<float>();
  fp.dk = ref_dk.data_ptr<float>();
  fp.dv = ref_dv.data_ptr<float>();
  fp.batch = sh.batch;
  fp.q_heads = sh.q_heads;
  fp.kv_heads = sh.kv_heads;
  fp.q_len = sh.q_len;
  fp.kv_len = sh.kv_len;
  fp.head_dim = sh.head_dim;
  fp.scale = static_cast<float>(call.scale);
  fp.causal = causal_of(call.causal);
  if (call.packed) {
    fp.cu_seqlens_q = cu_q.data_ptr<int32_t>();
    fp.cu_seqlens_k = cu_k.data_ptr<int32_t>();
    fp.num_segments = cu_q.numel() - 1;
  }
  fp.center_keys = true;
  fp.deterministic = true;  // no dQ atomics: the metrics are bit-repeatable
  {
    const size_t bytes = gpu::fp32_backward_workspace_bytes(fp);
    const at::Tensor workspace = bytes_on(q, bytes);
    const gpu::Status status = gpu::fp32_attention_backward(fp, workspace.data_ptr(), bytes, stream);
    TORCH_CHECK(status.ok(), "gaugewatch: attention_metrics: CUDA fp32 backward failed: ", status.message);
  }

  gpu::MetricsShape ms;
  ms.batch = sh.batch;
  ms.q_heads = sh.q_heads;
  ms.kv_heads = sh.kv_heads;
  ms.q_len = sh.q_len;
  ms.kv_len = sh.kv_len;
  ms.head_dim = sh.head_dim;
  ms.scale = call.scale;
  ms.causal = causal_of(call.causal);

  // 4: translated keys and lse (masking plays no part in the translation).
  const at::Tensor k_shift = at::empty(k.sizes(), k.options());
  const at::Tensor lse_shift = at::empty(lse.sizes(), f32);
  {
    gpu::TranslateParams t;
    t.shape = ms;
    t.q = qf.data_ptr<float>();
    t.k = kf.data_ptr<float>();
    t.lse = lse.data_ptr<float>();
    t.k_out = bf16_mut(k_shift);
    t.lse_out = lse_shift.data_ptr<float>();
    const size_t bytes = gpu::translate_workspace_bytes(t);
    const at::Tensor workspace = bytes_on(q, bytes);
    const gpu::Status status = gpu::translate_keys(t, workspace.data_ptr(), bytes, stream);
    TORCH_CHECK(status.ok(), "gaugewatch: attention_metrics: key translation failed: ", status.message);
  }
  // 5: the same backends on K + b (the saved output does not move).
  const Bf16Run live_t =
      run_bf16(call, gpu::Projection::kNone, grad_out, q, k_shift, v, out, lse_shift, cu_q, cu_k, {}, stream);
  const Bf16Run gproj_t =
      run_bf16(call, gpu::Projection::kGproj, grad_out, q, k_shift, v, out, lse_shift, cu_q, cu_k, {}, stream);

  // 6: the reductions.
  at::Tensor result = at::empty({static_cast<int64_t>(gpu::kMetricCount)}, q.options().dtype(at::kDouble));
  using gpu::ElementType;
  auto bf16_view = [](const at::Tensor& t) { return gpu::TensorView{t.data_ptr(), ElementType::kBf16}; };
  auto fp32_view = [](const at::Tensor& t) { return gpu::TensorView{t.data_ptr(), ElementType::kFp32}; };
  gpu::MetricsParams mp;
  mp.shape = ms;
  if (call.packed) {
    mp.shape.cu_seqlens_q = cu_q.data_ptr<int32_t>();
    mp.shape.cu_seqlens_k = cu_k.data_ptr<int32_t>();
    mp.shape.num_segments = cu_q.numel() - 1;
  }
  mp.q = qf.data_ptr<float>();
  mp.k = kf.data_ptr<float>();
  mp.row_mass = row_mass.data_ptr<float>();
  mp.abs_row_mass = abs_row_mass.data_ptr<float>();
  mp.live = {bf16_view(live.dq), bf16_view(live.dk), bf16_view(live.dv)};
  mp.gproj = {bf16_view(gproj.dq), bf16_view(gproj.dk), bf16_view(gproj.dv)};
  mp.reference = {fp32_view(ref_dq), fp32_view(ref_dk), fp32_view(ref_dv)};
  mp.live_dq_translated = bf16_view(live_t.dq);
  mp.gproj_dq_translated = bf16_view(gproj_t.dq);
  mp.out = result.data_ptr<double>();
  const size_t bytes = gpu::metrics_workspace_bytes(mp);
  const at::Tensor workspace = bytes_on(q, bytes);
  const gpu::Status status = gpu::attention_metrics(mp, workspace.data_ptr(), bytes, stream);
  TORCH_CHECK(status.ok(), "gaugewatch: attention_metrics: reduction kernels failed: ", status.message);
  // Every temporary above is freed into the caching allocator on this stream,
  // so reuse is ordered after the kernels that read it.
  return result;
}

}  // namespace

void register_cuda_metrics(torch::Library& m) { m.impl("attention_metrics", &attention_metrics_cuda); }

}  // namespace gaugewatch::torch_ops
