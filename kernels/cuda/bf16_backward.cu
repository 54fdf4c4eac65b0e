// Launcher of the fused BF16 attention backward: validation, workspace, the
// delta pre-pass, and dispatch on (head dim, projection) to the kernel pair.
// Host code only (every <<<>>> is in bf16_backward_delta.cu and the launch
// template), so the CPU emulation compiles this file as it is.
// Math and layouts: kernels/cuda/bf16_backward.h; kernels:
// kernels/cuda/bf16_backward_kernel.cuh.
// Build: target gaugewatch_cuda (sm_90a). Run: tests/cuda/bf16_backward_test.cpp.

#include "kernels/cuda/bf16_backward.h"

#include <cstdint>
#include <string>

#include "kernels/cuda/bf16_backward_kernel.cuh"
#include "kernels/cuda/launch_checks.h"

namespace gaugewatch::gpu {

namespace bf16 {
template <int D, Projection P>
cudaError_t launch(const Args& args, cudaStream_t stream);

}  // namespace bf16

namespace {

using checks::aligned16;
using checks::invalid;
using checks::kMaxGridY;
using checks::round_up;

struct Layout {
  size_t delta = 0, row_a = 0, row_b = 0, neg_lambda_q = 0, total = 0;
};

Layout layout_of(const Bf16BackwardParams& p) {
  const size_t rows = static_cast<size_t>(p.batch * p.q_heads * p.q_len);
  Layout w;
  w.delta = 0;
  w.row_a = round_up(rows * sizeof(float));
  w.row_b = w.row_a + round_up(rows * sizeof(float));
  w.neg_lambda_q = w.row_b + round_up(rows * sizeof(int32_t));
  // gproj: bf16(-lambda_i q_i) per row (BF16, rows x d), written once by the
  // dq kernel and read by every key tile of the dkdv kernel.
  const size_t lq_bytes = p.projection == Projection::kGproj ? rows * static_cast<size_t>(p.head_dim) * 2 : 0;
  w.total = w.neg_lambda_q + round_up(lq_bytes);
  return w;
}

}  // namespace

void Bf16BackwardParams::set_contiguous_strides() {
  const int64_t qrow = head_dim, krow = head_dim;
  q_strides[2] = grad_out_strides[2] = out_strides[2] = qrow;
  q_strides[1] = grad_out_strides[1] = out_strides[1] = q_len * qrow;
  q_strides[0] = grad_out_strides[0] = out_strides[0] = q_heads * q_len * qrow;
  k_strides[2] = v_strides[2] = krow;
  k_strides[1] = v_strides[1] = kv_len * krow;
  k_strides[0] = v_strides[0] = kv_heads * kv_len * krow;
  lse_strides[1] = q_len;
  lse_strides[0] = q_heads * q_len;
}

Status validate(const Bf16BackwardParams& p) {
  if (p.head_dim != 64 && p.head_dim != 128) {
    return invalid("head_dim " + std::to_string(p.head_dim) +
                   " is not supported by the fused BF16 backward (64 or 128); use backend fp32 for other head dims");
  }
  if (p.batch < 0 || p.q_heads <= 0 || p.kv_heads <= 0 || p.q_len < 0 || p.kv_len < 0) {
    return invalid("shape must have batch, q_len, kv_len >= 0 and q_heads, kv_heads > 0");
  }
  if (Status s = checks::check_heads_and_lengths(p.q_heads, p.kv_heads, p.q_len, p.kv_len); !s.ok()) return s;
  if (p.batch * p.q_heads > kMaxGridY || p.batch * p.kv_heads > kMaxGridY) {
    return invalid("batch * heads must be at most 65535 (one grid row per batch and head)");
  }
  if (p.projection != Projection::kNone && p.projection != Projection::kGproj && p.projection != Projection::kPivot) {
    return invalid("unknown projection");
  }
  if (p.diagnostics.any() && p.projection != Projection::kNone) {
    return invalid("row diagnostics are computed by the bf16 variant (projection kNone) only");
  }
  if (Status s = checks::check_packing(p.cu_seqlens_q, p.cu_seqlens_k, p.num_segments); !s.ok()) return s;
  const int64_t n_el = p.batch * p.q_heads * p.q_len, m_el = p.batch * p.kv_heads * p.kv_len;
  if (n_el > 0 && (!p.q || !p.grad_out || !p.out || !p.lse || !p.dq)) {
    return invalid("q, grad_out, out, lse and dq must be non-null");
  }
  if (m_el > 0 && (!p.k || !p.v || !p.dk || !p.dv)) return invalid("k, v, dk and dv must be non-null");
  const void* ptrs[] = {p.q, p.k, p.v, p.out, p.grad_out, p.dq, p.dk, p.dv};
  for (const void* ptr : ptrs) {
    if (ptr != nullptr && !aligned16(ptr)) return invalid("BF16 tensors must be 16-byte aligned");
  }
  const int64_t* strides[] = {p.q_strides, p.k_strides, p.v_strides, p.out_strides, p.grad_out_strides};
  for (const int64_t* s : strides) {
    for (int i = 0; i < 3; ++i) {
      if (s[i] % 8 != 0) {
        return invalid("BF16 tensor strides must be multiples of 8 elements (16-byte rows); call .contiguous()");
      }
    }
  }
  return {};
}

size_t bf16_backward_workspace_bytes(const Bf16BackwardParams& p) { return layout_of(p).total; }

Status bf16_attention_backward(const Bf16BackwardParams& p, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  Status st = validate(p);
  if (!st.ok()) return st;
  const Layout w = layout_of(p);
  st = checks::check_workspace(workspace, workspace_bytes, w.total);
  if (!st.ok()) return st;
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  auto* ws = static_cast<char*>(workspace);

  bf16::Args a{};
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.grad_out = p.grad_out;
  a.lse = p.lse;
  for (int i = 0; i < 3; ++i) {
    a.qs[i] = p.q_strides[i];
    a.ks[i] = p.k_strides[i];
    a.vs[i] = p.v_strides[i];
    a.gs[i] = p.grad_out_strides[i];
  }
  a.ls[0] = p.lse_strides[0];
  a.ls[1] = p.lse_strides[1];
  a.dq = p.dq;
  a.dk = p.dk;
  a.dv = p.dv;
  a.delta = reinterpret_cast<float*>(ws + w.delta);
  a.row_a = reinterpret_cast<float*>(ws + w.row_a);
  a.row_b = reinterpret_cast<int32_t*>(ws + w.row_b);
  a.neg_lambda_q = reinterpret_cast<uint16_t*>(ws + w.neg_lambda_q);
  a.batch = static_cast<int>(p.batch);
  a.hq = static_cast<int>(p.q_heads);
  a.hkv = static_cast<int>(p.kv_heads);
  a.group = static_cast<int>(p.q_heads / p.kv_heads);
  a.n = static_cast<int>(p.q_len);
  a.m = static_cast<int>(p.kv_len);
  a.scale = p.scale;
  a.scale_log2 = p.scale * bf16::kLog2e;
  a.causal = static_cast<int>(p.causal);
  a.cu_q = p.cu_seqlens_q;
  a.cu_k = p.cu_seqlens_k;
  a.num_segments = static_cast<int>(p.num_segments);
  a.diag = p.diagnostics;

  if (rows > 0) {
    bf16::DeltaArgs da{};
    da.grad_out = p.grad_out;
    da.out = p.out;
    for (int i = 0; i < 3; ++i) {
      da.gs[i] = p.grad_out_strides[i];
      da.os[i] = p.out_strides[i];
    }
    da.delta = reinterpret_cast<float*>(ws + w.delta);
    da.hq = a.hq;
    da.n = a.n;
    da.d = static_cast<int>(p.head_dim);
    da.rows = rows;
    const cudaError_t err = bf16::launch_delta(da, stream);
    if (err != cudaSuccess) return Status{err, std::string("delta pre-pass launch: ") + cudaGetErrorString(err)};
  }

  cudaError_t err = cudaSuccess;
  const bool d64 = p.head_dim == 64;
  switch (p.projection) {
    case Projection::kNone:
      err = d64 ? bf16::launch<64, Projection::kNone>(a, stream) : bf16::launch<128, Projection::kNone>(a, stream);
      break;
    case Projection::kGproj:
      err = d64 ? bf16::launch<64, Projection::kGproj>(a, stream) : bf16::launch<128, Projection::kGproj>(a, stream);
      break;
    case Projection::kPivot:
      err = d64 ? bf16::launch<64, Projection::kPivot>(a, stream) : bf16::launch<128, Projection::kPivot>(a, stream);
      break;
  }
  if (err != cudaSuccess) return Status{err, std::string("bf16 backward launch: ") + cudaGetErrorString(err)};
  return {};
}

}  // namespace gaugewatch::gpu
