// CUDA implementations of the gaugewatch ops, on the current CUDA stream:
// backend "fp32" runs the fused FP32 backward (kernels/cuda/fp32_backward.h),
// backends "gproj", "pivot" and "bf16" the fused BF16 backward
// (kernels/cuda/bf16_backward.h). attention_metrics: ops_cuda_metrics.cpp.
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

#include "kernels/cuda/bf16_backward.h"
#include "kernels/cuda/fp32_backward.h"
#include "kernels/torch/attention_call.h"
#include "kernels/torch/registration.h"

namespace gaugewatch::torch_ops {
namespace {

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

gpu::CausalMode to_gpu(reference::CausalMode mode) {
  switch (mode) {
    case reference::CausalMode::kTopLeft: return gpu::CausalMode::kTopLeft;
    case reference::CausalMode::kBottomRight: return gpu::CausalMode::kBottomRight;
    default: return gpu::CausalMode::kNone;
  }
}

// cu_seqlens as int32 on q's device. Offsets that are still on the CPU are
// checked here (0 first, length last, non-decreasing); device offsets are
// trusted and clamped by the kernel, since checking them would sync the stream.
at::Tensor device_offsets(const at::Tensor& t, int64_t length, const char* name, const at::Tensor& q) {
  if (t.device().is_cpu()) {
    const at::Tensor l = t.to(at::kLong).contiguous();
    const int64_t* p = l.data_ptr<int64_t>();
    const int64_t n = l.numel();
    TORCH_CHECK(p[0] == 0 && p[n - 1] == length, "gaugewatch: ", name, " must start at 0 and end at ", length,
                ", got ", p[0], " .. ", p[n - 1]);
    for (int64_t i = 1; i < n; ++i) {
      TORCH_CHECK(p[i] >= p[i - 1], "gaugewatch: ", name, " must be non-decreasing");
    }
  }
  return t.to(q.device(), at::kInt).contiguous();
}

Grads run_fp32(const AttentionCall& call, const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
               const at::Tensor& v, const std::optional<at::Tensor>& cu_seqlens_q,
               const std::optional<at::Tensor>& cu_seqlens_k, const std::optional<at::Tensor>& slices,
               const std::optional<at::Tensor>& rows, bool deterministic, bool center_keys) {
  const auto& sh = call.shape;
  TORCH_CHECK(sh.head_dim == 64 || sh.head_dim == 128 || sh.head_dim == 256,
              "gaugewatch: the CUDA fp32 backward supports head dims 64, 128 and 256, got ", sh.head_dim);
  const c10::cuda::CUDAGuard guard(q.device());
  // FP32 operands: BF16 values are exact in float.
  const at::Tensor qf = q.to(at::kFloat).contiguous();
  const at::Tensor kf = k.to(at::kFloat).contiguous();
  const at::Tensor vf = v.to(at::kFloat).contiguous();
  const at::Tensor of = grad_out.to(at::kFloat).contiguous();
  const auto options = q.options().dtype(at::kFloat);

  gpu::Fp32BackwardParams p;
  p.q = qf.data_ptr<float>();
  p.k = kf.data_ptr<float>();
  p.v = vf.data_ptr<float>();
  p.grad_out = of.data_ptr<float>();
  p.batch = sh.batch;
  p.q_heads = sh.q_heads;
  p.kv_heads = sh.kv_heads;
  p.q_len = sh.q_len;
  p.kv_len = sh.kv_len;
  p.head_dim = sh.head_dim;
  p.scale = static_cast<float>(call.scale);
  p.causal = to_gpu(call.causal);
  p.center_keys = center_keys;
  p.deterministic = deterministic;

  at::Tensor cu_q, cu_k, slices_d, rows_d;
  if (call.packed) {
    cu_q = device_offsets(*cu_seqlens_q, sh.q_len, "cu_seqlens_q", q);
    cu_k = device_offsets(*cu_seqlens_k, sh.kv_len, "cu_seqlens_k", q);
    p.cu_seqlens_q = cu_q.data_ptr<int32_t>();
    p.cu_seqlens_k = cu_k.data_ptr<int32_t>();
    p.num_segments = cu_q.numel() - 1;
  }
  at::Tensor dq;
  if (slices.has_value()) {
    slices_d = slices->to(q.device(), at::kInt).contiguous();
    rows_d = rows->to(q.device(), at::kInt).contiguous();
    p.slices = slices_d.data_ptr<int32_t>();
    p.num_slices = slices_d.numel();
    p.rows = rows_d.data_ptr<int32_t>();
    p.num_rows = rows_d.numel();
    dq = at::empty({p.num_slices, p.num_rows, sh.head_dim}, options);
  } else {
    dq = at::empty(q.sizes(), options);
  }
  at::Tensor dk = at::empty(k.sizes(), options);
  at::Tensor dv = at::empty(k.sizes(), options);
  p.dq = dq.data_ptr<float>();
  p.dk = dk.data_ptr<float>();
  p.dv = dv.data_ptr<float>();

  const size_t bytes = gpu::fp32_backward_workspace_bytes(p);
  const at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
  const gpu::Status status =
      gpu::fp32_attention_backward(p, workspace.data_ptr(), bytes, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(status.ok(), "gaugewatch: CUDA fp32 backward failed: ", status.message);
  return {dq, dk, dv};
}

gpu::Projection projection_of(Backend backend) {
  switch (backend) {
    case Backend::kGproj: return gpu::Projection::kGproj;
    case Backend::kPivot: return gpu::Projection::kPivot;
    default: return gpu::Projection::kNone;
  }
}

// Element strides (batch, head, row) of a (B, H, L, d) BF16 operand, taken as
// it is when its rows are contiguous and 16-byte aligned (SDPA's transposed
// (B, L, H, d) views qualify), otherwise from a contiguous copy.
at::Tensor kernel_operand(const at::Tensor& t, int64_t (&strides)[3]) {
  // A dimension of size 1 is never stepped along: its stride is irrelevant.
  auto stride_of = [](const at::Tensor& x, int i) { return x.size(i) > 1 ? x.stride(i) : int64_t{0}; };
  bool usable = (t.size(3) <= 1 || t.stride(3) == 1) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  for (int i = 0; i < 3; ++i) usable = usable && stride_of(t, i) % 8 == 0;
  const at::Tensor u = usable ? t : t.contiguous();
  for (int i = 0; i < 3; ++i) strides[i] = stride_of(u, i);
  return u;
}

Grads run_bf16(const AttentionCall& call, Backend backend, const at::Tensor& grad_out, const at::Tensor& q,
               const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
               const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
               bool deterministic) {
  const auto& sh = call.shape;
  TORCH_CHECK(sh.head_dim == 64 || sh.head_dim == 128, "gaugewatch: the fused BF16 backward (backend '",
              backend_name(backend), "') supports head dims 64 and 128, got ", sh.head_dim,
              "; use backend='fp32' for this head dim");
  const c10::cuda::CUDAGuard guard(q.device());
  gpu::Bf16BackwardParams p;
  const at::Tensor qk = kernel_operand(q, p.q_strides);
  const at::Tensor kk = kernel_operand(k, p.k_strides);
  const at::Tensor vk = kernel_operand(v, p.v_strides);
  const at::Tensor ok = kernel_operand(out, p.out_strides);
  const at::Tensor gk = kernel_operand(grad_out, p.grad_out_strides);
  const at::Tensor lk = lse.stride(2) == 1 ? lse : lse.contiguous();
  p.lse_strides[0] = lk.stride(0);
  p.lse_strides[1] = lk.stride(1);
  p.q = static_cast<const uint16_t*>(qk.data_ptr());
  p.k = static_cast<const uint16_t*>(kk.data_ptr());
  p.v = static_cast<const uint16_t*>(vk.data_ptr());
  p.out = static_cast<const uint16_t*>(ok.data_ptr());
  p.grad_out = static_cast<const uint16_t*>(gk.data_ptr());
  p.lse = lk.data_ptr<float>();
  at::Tensor dq = at::empty(q.sizes(), q.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor dk = at::empty(k.sizes(), k.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor dv = at::empty(v.sizes(), v.options().memory_format(at::MemoryFormat::Contiguous));
  p.dq = static_cast<uint16_t*>(dq.data_ptr());
  p.dk = static_cast<uint16_t*>(dk.data_ptr());
  p.dv = static_cast<uint16_t*>(dv.data_ptr());
  p.batch = sh.batch;
  p.q_heads = sh.q_heads;
  p.kv_heads = sh.kv_heads;
  p.q_len = sh.q_len;
  p.kv_len = sh.kv_len;
  p.head_dim = sh.head_dim;
  p.scale = static_cast<float>(call.scale);
  p.causal = to_gpu(call.causal);
  p.projection = projection_of(backend);
  p.deterministic = deterministic;
  at::Tensor cu_q, cu_k;
  if (call.packed) {
    cu_q = device_offsets(*cu_seqlens_q, sh.q_len, "cu_seqlens_q", q);
    cu_k = device_offsets(*cu_seqlens_k, sh.kv_len, "cu_seqlens_k", q);
    p.cu_seqlens_q = cu_q.data_ptr<int32_t>();
    p.cu_seqlens_k = cu_k.data_ptr<int32_t>();
    p.num_segments = cu_q.numel() - 1;
  }
  const size_t bytes = gpu::bf16_backward_workspace_bytes(p);
  const at::Tensor workspace = at::empty({static_cast<int64_t>(bytes)}, q.options().dtype(at::kByte));
  const gpu::Status status =
      gpu::bf16_attention_backward(p, workspace.data_ptr(), bytes, at::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(status.ok(), "gaugewatch: CUDA ", backend_name(backend), " backward failed: ", status.message);
  return {dq, dk, dv};
}

Grads attention_backward_cuda(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool is_causal,
                              std::optional<double> scale, c10::string_view backend_arg,
                              c10::string_view causal_alignment, const std::optional<at::Tensor>& cu_seqlens_q,
                              const std::optional<at::Tensor>& cu_seqlens_k, bool deterministic, bool center_keys) {
  const AttentionCall call = check_attention_call(grad_out, q, k, v, out, lse, is_causal, scale, causal_alignment,
                                                  cu_seqlens_q, cu_seqlens_k);
  const Backend backend = parse_backend(backend_arg);
  TORCH_CHECK(backend != Backend::kFp64, "gaugewatch: backend 'fp64' is the CPU reference only; pass CPU tensors");
  if (backend != Backend::kFp32) {
    return run_bf16(call, backend, grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, deterministic);
  }
  return run_fp32(call, grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, std::nullopt, std::nullopt, deterministic,
                  center_keys);
}

Grads attention_backward_rows_cuda(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                   const at::Tensor& slices, const at::Tensor& rows, bool is_causal,
                                   std::optional<double> scale, c10::string_view causal_alignment,
                                   const std::optional<at::Tensor>& cu_seqlens_q,
                                   const std::optional<at::Tensor>& cu_seqlens_k, bool deterministic,
                                   bool center_keys) {
  const AttentionCall call = check_attention_call(grad_out, q, k, v, out, lse, is_causal, scale, causal_alignment,
                                                  cu_seqlens_q, cu_seqlens_k);
  check_row_subset(call, slices, rows, q);
  return run_fp32(call, grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, slices, rows, deterministic, center_keys);
}

}  // namespace

void register_cuda_kernels(torch::Library& m) {
  m.impl("attention_backward", &attention_backward_cuda);
  m.impl("attention_backward_rows", &attention_backward_rows_cuda);
  register_cuda_metrics(m);
}

}  // namespace gaugewatch::torch_ops
