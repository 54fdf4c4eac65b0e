// CUDA implementations of the gaugewatch ops, on the current CUDA stream:
// backend "fp32" runs the fused FP32 backward (kernels/cuda/fp32_backward.h,
// attn_mask included), backends "gproj", "pivot" and "bf16" the fused BF16
// backward (kernels/cuda/bf16_backward.h; no attn_mask), backend "center" and
// center_keys: ops_cuda_center.cpp; attention_metrics: ops_cuda_metrics.cpp.
// Schemas and semantics: kernels/torch/registration.cpp.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "kernels/torch/attention_call.h"
#include "kernels/torch/attention_mask.h"
#include "kernels/torch/cuda_launch.h"
#include "kernels/torch/ops_cuda_center.h"
#include "kernels/torch/registration.h"
#include "kernels/torch/stride_order.h"

namespace gaugewatch::torch_ops {
namespace {

// The kernel's projection of a backend: the backend table's `projection` column.
gpu::Projection projection_of(Backend backend) {
  switch (backend_spec(backend).projection) {
    case Projection::kGproj: return gpu::Projection::kGproj;
    case Projection::kPivot: return gpu::Projection::kPivot;
    case Projection::kNone: break;
  }
  return gpu::Projection::kNone;
}

Grads run_fp32(const AttentionCall& call, const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
               const at::Tensor& v, const std::optional<at::Tensor>& cu_seqlens_q,
               const std::optional<at::Tensor>& cu_seqlens_k, const std::optional<at::Tensor>& slices,
               const std::optional<at::Tensor>& rows, bool deterministic, bool center_keys,
               const std::optional<at::Tensor>& attn_mask) {
  const auto& sh = call.shape;
  TORCH_CHECK(sh.head_dim == 64 || sh.head_dim == 128 || sh.head_dim == 256,
              "gaugewatch: the CUDA fp32 backward supports head dims 64, 128 and 256, got ", sh.head_dim);
  const c10::cuda::CUDAGuard guard(q.device());
  // FP32 operands: BF16 values are exact in float.
  const at::Tensor qf = q.to(at::kFloat).contiguous();
  const at::Tensor kf = k.to(at::kFloat).contiguous();
  const at::Tensor vf = v.to(at::kFloat).contiguous();
  const at::Tensor gf = grad_out.to(at::kFloat).contiguous();
  std::optional<Fp32Subset> subset;
  if (slices.has_value()) {
    subset = Fp32Subset{slices->to(q.device(), at::kInt).contiguous(), rows->to(q.device(), at::kInt).contiguous()};
  }
  return fused_fp32_backward(call, gf, qf, kf, vf, device_offsets(call, cu_seqlens_q, cu_seqlens_k, q),
                             device_mask(attn_mask), subset, deterministic, center_keys,
                             at::cuda::getCurrentCUDAStream().stream());
}

Grads run_bf16(const AttentionCall& call, Backend backend, const at::Tensor& grad_out, const at::Tensor& q,
               const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
               const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
               bool deterministic) {
  const int64_t d = call.shape.head_dim;
  TORCH_CHECK(d == 64 || d == 128 || d == 256, "gaugewatch: the fused BF16 backward (backend '",
              gaugewatch::backend_name(backend), "') supports head dims 64, 128 and 256, got ", d,
              "; use backend='center' for this head dim (on CPU tensors 'fp32' takes any)");
  const c10::cuda::CUDAGuard guard(q.device());
  return fused_bf16_backward(call, projection_of(backend), grad_out, q, k, v, out, lse,
                             device_offsets(call, cu_seqlens_q, cu_seqlens_k, q), {},
                             at::cuda::getCurrentCUDAStream().stream(), deterministic);
}

Grads attention_backward_cuda(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool is_causal,
                              std::optional<double> scale, c10::string_view backend_arg,
                              c10::string_view causal_alignment, const std::optional<at::Tensor>& cu_seqlens_q,
                              const std::optional<at::Tensor>& cu_seqlens_k, bool deterministic, bool center_keys,
                              const std::optional<at::Tensor>& attn_mask) {
  const AttentionCall call = check_attention_call(grad_out, q, k, v, out, lse, is_causal, scale, causal_alignment,
                                                  cu_seqlens_q, cu_seqlens_k);
  check_attn_mask(attn_mask, call, q);
  const Backend backend = parse_backend(backend_arg);
  TORCH_CHECK(backend != Backend::kFp64, "gaugewatch: backend 'fp64' is the CPU reference only; pass CPU tensors");
  // Every backend returns the gradients dense in the stride order of q, k, v
  // (stride_order.h, as the Meta kernel says): the fused BF16 kernels write
  // them so; the FP32 kernel's contiguous results and the stock backward's
  // (center) are copied where their layout differs.
  if (backend == Backend::kCenter) {
    const c10::cuda::CUDAGuard guard(q.device());
    return in_operand_order(center_backward_cuda(call, grad_out, q, k, v, out, lse, attn_mask), q, k, v);
  }
  if (backend == Backend::kFp32) {
    return in_operand_order(run_fp32(call, grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, std::nullopt, std::nullopt,
                                     deterministic, center_keys, attn_mask),
                            q, k, v);
  }
  TORCH_CHECK(!attn_mask.has_value(), "gaugewatch: backend '", gaugewatch::backend_name(backend),
              "' (the fused BF16 backward) takes no attn_mask; use backend 'center' (the stock backward on "
              "centred keys) or 'fp32' for masked calls");
  // deterministic: the two-kernel pair (no atomics); otherwise bf16 and pivot
  // run the key-outer kernel, gproj at head dims 64 and 256 (at 128 where it
  // runs warp-specialized) unless GAUGEWATCH_GPROJ_KERNEL says otherwise
  // (kernels/cuda/bf16_backward.h, cuda_launch.h).
  return run_bf16(call, backend, grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, deterministic);
}

Grads attention_backward_rows_cuda(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                   const at::Tensor& slices, const at::Tensor& rows, bool is_causal,
                                   std::optional<double> scale, c10::string_view causal_alignment,
                                   const std::optional<at::Tensor>& cu_seqlens_q,
                                   const std::optional<at::Tensor>& cu_seqlens_k, bool deterministic,
                                   bool center_keys, const std::optional<at::Tensor>& attn_mask) {
  const AttentionCall call = check_attention_call(grad_out, q, k, v, out, lse, is_causal, scale, causal_alignment,
                                                  cu_seqlens_q, cu_seqlens_k);
  check_row_subset(call, slices, rows, q);
  check_attn_mask(attn_mask, call, q);
  return run_fp32(call, grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, slices, rows, deterministic, center_keys,
                  attn_mask);
}

}  // namespace

void register_cuda_kernels(torch::Library& m) {
  m.impl("attention_backward", &attention_backward_cuda);
  m.impl("attention_backward_rows", &attention_backward_rows_cuda);
  register_cuda_center(m);
  register_cuda_metrics(m);
}

}  // namespace gaugewatch::torch_ops
