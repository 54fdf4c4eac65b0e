// Launcher of the fused FP32 attention backward: validates the parameters,
// carves the workspace, zeroes dQ for the atomic mode, computes the mean keys
// and dispatches on the head dim. Math and layouts: kernels/cuda/fp32_backward.h.
// Build: target gaugewatch_cuda (sm_90a). Run: tests/cuda/fp32_backward_test.cu.

#include "kernels/cuda/fp32_backward.h"

#include <cstdint>
#include <string>

#include "kernels/cuda/fp32_backward_kernel.cuh"
#include "kernels/cuda/launch_checks.h"

namespace gaugewatch::gpu {

namespace detail {
template <int D>
cudaError_t launch_fp32_backward(const Args& args, cudaStream_t stream);
template <int D>
cudaError_t launch_mean_key(const float* k, float* mu, int64_t heads, int64_t m, cudaStream_t stream);
}  // namespace detail

namespace {

using checks::aligned16;
using checks::invalid;
using checks::kMaxGridY;
using checks::round_up;

struct WorkspaceLayout {
  size_t row_max = 0, row_sum = 0, delta = 0, mu = 0, total = 0;
};

WorkspaceLayout layout_of(const Fp32BackwardParams& p) {
  WorkspaceLayout w;
  const size_t rows = static_cast<size_t>(p.slice_count()) * static_cast<size_t>(p.row_count());
  w.row_max = 0;
  w.row_sum = round_up(rows * sizeof(float));
  w.delta = w.row_sum + round_up(rows * sizeof(float));
  w.mu = w.delta + round_up(rows * sizeof(float));
  const ProblemShape& sh = p.shape;
  const size_t mu_bytes =
      p.center_keys ? static_cast<size_t>(sh.batch * sh.kv_heads * sh.head_dim) * sizeof(float) : 0;
  w.total = w.mu + round_up(mu_bytes);
  return w;
}

}  // namespace

Status validate(const Fp32BackwardParams& params) {
  const ProblemShape& p = params.shape;
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) {
    return invalid("head_dim " + std::to_string(p.head_dim) + " is not supported (64, 128 or 256)");
  }
  if (p.batch < 0 || p.q_heads <= 0 || p.kv_heads <= 0 || p.q_len < 0 || p.kv_len < 0) {
    return invalid("shape must have batch, q_len, kv_len >= 0 and q_heads, kv_heads > 0");
  }
  if (Status s = checks::check_heads_and_lengths(p.q_heads, p.kv_heads, p.q_len, p.kv_len); !s.ok()) return s;
  if (p.batch * p.kv_heads > kMaxGridY) return invalid("batch * kv_heads exceeds 65535");
  if (params.slice_count() > kMaxGridY) return invalid("number of (batch, head) slices exceeds 65535");
  if (Status s = checks::check_packing(p.cu_seqlens_q, p.cu_seqlens_k, p.num_segments); !s.ok()) return s;
  if (Status s = checks::check_mask(p.mask); !s.ok()) return s;
  const Fp32BackwardParams& t = params;
  if ((t.slices == nullptr) != (t.rows == nullptr)) {
    return invalid("row-subset mode needs both slices and rows");
  }
  if (t.subset() && (t.num_slices < 0 || t.num_rows < 0)) return invalid("num_slices, num_rows must be >= 0");
  const bool empty_q = t.slice_count() == 0 || t.row_count() == 0;
  const bool empty_kv = p.batch * p.kv_heads * p.kv_len == 0;
  if (!empty_q && (t.q == nullptr || t.grad_out == nullptr || t.dq == nullptr)) {
    return invalid("q, grad_out and dq must be non-null");
  }
  if (!empty_kv && (t.k == nullptr || t.v == nullptr || t.dk == nullptr || t.dv == nullptr)) {
    return invalid("k, v, dk and dv must be non-null");
  }
  if (!aligned16(t.q) || !aligned16(t.k) || !aligned16(t.v) || !aligned16(t.grad_out) || !aligned16(t.dq) ||
      !aligned16(t.dk) || !aligned16(t.dv)) {
    return invalid("q, k, v, grad_out, dq, dk, dv must be 16-byte aligned (float4 access)");
  }
  return {};
}

size_t fp32_backward_workspace_bytes(const Fp32BackwardParams& params) { return layout_of(params).total; }

Status fp32_attention_backward(const Fp32BackwardParams& p, void* workspace, size_t workspace_bytes,
                               cudaStream_t stream) {
  Status status = validate(p);
  if (!status.ok()) return status;
  const WorkspaceLayout w = layout_of(p);
  status = checks::check_workspace(workspace, workspace_bytes, w.total);
  if (!status.ok()) return status;
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0) return invalid("workspace must be 16-byte aligned");
  char* ws = static_cast<char*>(workspace);

  detail::Args a{};
  a.q = p.q;
  a.k = p.k;
  a.v = p.v;
  a.dout = p.grad_out;
  a.dq = p.dq;
  a.dk = p.dk;
  a.dv = p.dv;
  a.row_max = reinterpret_cast<float*>(ws + w.row_max);
  a.row_sum = reinterpret_cast<float*>(ws + w.row_sum);
  a.delta = reinterpret_cast<float*>(ws + w.delta);
  a.mu = p.center_keys ? reinterpret_cast<float*>(ws + w.mu) : nullptr;
  const ProblemShape& sh = p.shape;
  a.cu_q = sh.cu_seqlens_q;
  a.cu_k = sh.cu_seqlens_k;
  a.slices = p.slices;
  a.rows = p.rows;
  a.batch = sh.batch;
  a.hq = sh.q_heads;
  a.hkv = sh.kv_heads;
  a.n = sh.q_len;
  a.m = sh.kv_len;
  a.num_slices = p.slice_count();
  a.num_rows = p.row_count();
  a.num_segments = static_cast<int>(sh.num_segments);
  a.causal = static_cast<int>(sh.causal);
  a.mask = sh.mask;
  a.scale = static_cast<float>(sh.scale);
  a.dq_atomic = !p.deterministic;
  a.dq_in_rows = p.deterministic;

  const size_t dq_bytes = static_cast<size_t>(a.num_slices * a.num_rows * sh.head_dim) * sizeof(float);
  if (!p.deterministic && dq_bytes > 0) {
    const cudaError_t err = cudaMemsetAsync(p.dq, 0, dq_bytes, stream);
    if (err != cudaSuccess) return checks::cuda_failure("cudaMemsetAsync(dq)", err);
  }
  const int64_t kv_heads_total = sh.batch * sh.kv_heads;
  cudaError_t err = cudaSuccess;
  switch (sh.head_dim) {
    case 64:
      if (p.center_keys) err = detail::launch_mean_key<64>(p.k, const_cast<float*>(a.mu), kv_heads_total, sh.kv_len, stream);
      if (err == cudaSuccess) err = detail::launch_fp32_backward<64>(a, stream);
      break;
    case 128:
      if (p.center_keys) err = detail::launch_mean_key<128>(p.k, const_cast<float*>(a.mu), kv_heads_total, sh.kv_len, stream);
      if (err == cudaSuccess) err = detail::launch_fp32_backward<128>(a, stream);
      break;
    default:
      if (p.center_keys) err = detail::launch_mean_key<256>(p.k, const_cast<float*>(a.mu), kv_heads_total, sh.kv_len, stream);
      if (err == cudaSuccess) err = detail::launch_fp32_backward<256>(a, stream);
      break;
  }
  if (err != cudaSuccess) return checks::cuda_failure("fp32 attention backward launch", err);
  return {};
}

}  // namespace gaugewatch::gpu
