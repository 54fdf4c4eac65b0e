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

#include "kernels/cuda/metrics.h"
#include "kernels/reference/metric_catalogue.h"
#include "kernels/torch/attention_call.h"
#include "kernels/torch/attention_mask.h"
#include "kernels/torch/cuda_launch.h"
#include "kernels/torch/registration.h"

namespace gaugewatch::torch_ops {
namespace {

static_assert(gpu::kMetricCount == reference::kMetricCount);

uint16_t* bf16_mut(const at::Tensor& t) { return static_cast<uint16_t*>(t.data_ptr()); }
at::Tensor bytes_on(const at::Tensor& like, size_t bytes) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

at::Tensor attention_metrics_cuda(const at::Tensor& grad_out_arg, const at::Tensor& q_arg, const at::Tensor& k_arg,
                                  const at::Tensor& v_arg, const at::Tensor& out_arg, const at::Tensor& lse_arg,
                                  bool is_causal, std::optional<double> scale, c10::string_view causal_alignment,
                                  const std::optional<at::Tensor>& cu_seqlens_q,
                                  const std::optional<at::Tensor>& cu_seqlens_k,
                                  const std::optional<at::Tensor>& attn_mask) {
  const AttentionCall call = check_attention_call(grad_out_arg, q_arg, k_arg, v_arg, out_arg, lse_arg, is_causal,
                                                  scale, causal_alignment, cu_seqlens_q, cu_seqlens_k);
  check_attn_mask(attn_mask, call, q_arg);
  TORCH_CHECK(!attn_mask.has_value(),
              "gaugewatch: attention_metrics on CUDA takes no attn_mask: its live and gproj runs are the fused BF16 "
              "kernels, which take none; pass CPU tensors for the masked metrics, and measure a masked call's live "
              "gradients against attention_backward_rows / attention_backward(backend='fp32', attn_mask=...)");
  const auto& sh = call.shape;
  TORCH_CHECK(sh.head_dim == 64 || sh.head_dim == 128 || sh.head_dim == 256,
              "gaugewatch: attention_metrics on CUDA runs the fused BF16 backward, which supports head dims 64, "
              "128 and 256, got ",
              sh.head_dim, "; pass CPU tensors for the reference metrics");
  const c10::cuda::CUDAGuard guard(q_arg.device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();

  const at::Tensor q = q_arg.contiguous(), k = k_arg.contiguous(), v = v_arg.contiguous();
  const at::Tensor out = out_arg.contiguous(), grad_out = grad_out_arg.contiguous(), lse = lse_arg.contiguous();
  // FP32 copies (BF16 values are exact): the FP32 recompute's operands and
  // the geometry's.
  const at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat);
  const at::Tensor vf = v.to(at::kFloat), gf = grad_out.to(at::kFloat);
  const DeviceOffsets offsets = device_offsets(call, cu_seqlens_q, cu_seqlens_k, q);

  // 1, 2: live (bf16) with row diagnostics, and gproj.
  const auto f32 = q.options().dtype(at::kFloat);
  const at::Tensor row_mass = at::empty(lse.sizes(), f32), abs_row_mass = at::empty(lse.sizes(), f32);
  gpu::Bf16RowDiagnostics diag;
  diag.row_mass = row_mass.data_ptr<float>();
  diag.abs_row_mass = abs_row_mass.data_ptr<float>();
  const auto [live_dq, live_dk, live_dv] =
      fused_bf16_backward(call, gpu::Projection::kNone, grad_out, q, k, v, out, lse, offsets, diag, stream);
  const auto [gproj_dq, gproj_dk, gproj_dv] =
      fused_bf16_backward(call, gpu::Projection::kGproj, grad_out, q, k, v, out, lse, offsets, {}, stream);

  // 3: the FP32 recompute, key-centred as reference::backward_fp32's default;
  // deterministic (no dQ atomics): the metrics are bit-repeatable.
  const auto [ref_dq, ref_dk, ref_dv] =
      fused_fp32_backward(call, gf, qf, kf, vf, offsets, {}, std::nullopt, true, true, stream);

  // Not packed here: the translation ignores masking; the reductions get the offsets.
  const gpu::ProblemShape ms = gpu::problem_shape(sh, call.scale, call.causal);

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
  const at::Tensor live_dq_t = std::get<0>(
      fused_bf16_backward(call, gpu::Projection::kNone, grad_out, q, k_shift, v, out, lse_shift, offsets, {}, stream));
  const at::Tensor gproj_dq_t = std::get<0>(fused_bf16_backward(call, gpu::Projection::kGproj, grad_out, q, k_shift,
                                                                 v, out, lse_shift, offsets, {}, stream));

  // 6: the reductions.
  at::Tensor result = at::empty({static_cast<int64_t>(gpu::kMetricCount)}, q.options().dtype(at::kDouble));
  using gpu::ElementType;
  auto bf16_view = [](const at::Tensor& t) { return gpu::TensorView{t.data_ptr(), ElementType::kBf16}; };
  auto fp32_view = [](const at::Tensor& t) { return gpu::TensorView{t.data_ptr(), ElementType::kFp32}; };
  gpu::MetricsParams mp;
  mp.shape = problem_shape(call, offsets);
  mp.q = qf.data_ptr<float>();
  mp.k = kf.data_ptr<float>();
  mp.row_mass = row_mass.data_ptr<float>();
  mp.abs_row_mass = abs_row_mass.data_ptr<float>();
  mp.live = {bf16_view(live_dq), bf16_view(live_dk), bf16_view(live_dv)};
  mp.gproj = {bf16_view(gproj_dq), bf16_view(gproj_dk), bf16_view(gproj_dv)};
  mp.reference = {fp32_view(ref_dq), fp32_view(ref_dk), fp32_view(ref_dv)};
  mp.live_dq_translated = bf16_view(live_dq_t);
  mp.gproj_dq_translated = bf16_view(gproj_dq_t);
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
