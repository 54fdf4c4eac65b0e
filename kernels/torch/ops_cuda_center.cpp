// Key centring on CUDA: the center_keys op (kernels/cuda/key_centring.h, one
// kernel) and backend "center" of attention_backward, the device's stock SDPA
// backward on the centred operands. Contract:
// kernels/torch/registration.cpp; the math: docs/numerics.md, Key centring.

#include "kernels/torch/ops_cuda_center.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdint>
#include <limits>

#include "kernels/reference/key_centring.h"
#include "kernels/torch/center_keys_call.h"
#include "kernels/torch/cuda_launch.h"

namespace gaugewatch::torch_ops {
namespace {

gpu::CentringPolicy gpu_policy(reference::CentringPolicy policy) {
  switch (policy) {
    case reference::CentringPolicy::kAlways: return gpu::CentringPolicy::kAlways;
    case reference::CentringPolicy::kNever: return gpu::CentringPolicy::kNever;
    default: return gpu::CentringPolicy::kAuto;
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> center_keys_cuda(const at::Tensor& q, const at::Tensor& k,
                                                                const at::Tensor& lse, std::optional<double> scale,
                                                                c10::string_view policy) {
  const CenterKeysCall call = check_center_keys(q, k, lse, scale, policy);
  TORCH_CHECK(call.head_dim <= 256, "gaugewatch: center_keys on CUDA supports head dims up to 256, got ",
              call.head_dim);
  const c10::cuda::CUDAGuard guard(q.device());
  return centred_keys(q, k, lse, call.scale, gpu_policy(call.policy), reference::kCentringOffsetSpreadRatio,
                      at::cuda::getCurrentCUDAStream().stream());
}

// attn_mask as the memory-efficient backward takes a bias: q's dtype, -inf
// where a bool mask is False, last dim padded to 16 elements and sliced back
// (the kernel's row alignment), then broadcast to (B, Hq, N, M).
at::Tensor efficient_bias(const at::Tensor& attn_mask, const AttentionCall& call, const at::Tensor& q) {
  at::Tensor m = attn_mask;
  while (m.dim() < 4) m = m.unsqueeze(0);
  const int64_t keys = call.shape.kv_len, padded = (keys + 15) / 16 * 16;
  at::Tensor bias = at::zeros({m.size(0), m.size(1), m.size(2), padded}, q.options());
  at::Tensor body = bias.narrow(3, 0, keys);
  if (m.scalar_type() == at::kBool) {
    body.masked_fill_(m.logical_not(), -std::numeric_limits<double>::infinity());
  } else {
    body.copy_(m);
  }
  const auto& s = call.shape;
  return body.expand({s.batch, s.q_heads, s.q_len, s.kv_len});
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> center_backward_cuda(
    const AttentionCall& call, const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& attn_mask) {
  const auto& s = call.shape;
  TORCH_CHECK(!call.packed, "gaugewatch: backend 'center' on CUDA takes no cu_seqlens (packed sequences); use "
                            "gproj, pivot or fp32");
  const bool causal = call.causal != reference::CausalMode::kNone;
  const bool square = s.q_len == s.kv_len;  // both causal alignments agree
  TORCH_CHECK(!causal || square || call.causal == reference::CausalMode::kTopLeft,
              "gaugewatch: backend 'center' on CUDA supports bottom-right causal only with N == M (SDPA's "
              "backwards align causal masks top-left); use gproj, pivot or fp32");
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  // Dropout 0: the backwards never read the RNG state (allocated on q's
  // device, where the ops expect it; never filled: no device work).
  const at::Tensor philox_seed = at::empty({}, q.options().dtype(at::kLong));
  const at::Tensor philox_offset = at::empty({}, q.options().dtype(at::kLong));
  if (!attn_mask.has_value() && (!causal || square)) {
    // Flash: lse (B, Hq, N) as given; GQA natively (kv heads as they are,
    // their gradients summed by the op), as SDPA's flash path calls it.
    const auto [k_centred, lse_shifted, kbar] =
        centred_keys(q, k, lse, call.scale, gpu::CentringPolicy::kAuto, reference::kCentringOffsetSpreadRatio, stream);
    return at::_scaled_dot_product_flash_attention_backward(grad_out, q, k_centred, v, out, lse_shifted, at::Tensor(),
                                                            at::Tensor(), s.q_len, s.kv_len, 0.0, causal,
                                                            philox_seed, philox_offset, call.scale);
  }
  // Memory-efficient: lse padded to a multiple of 32 rows as its forward
  // saves it (the centring writes the padding); is_causal is top-left, the
  // attn_mask a bias; one key/value head per query head, each kv head's
  // gradient the sum over its group.
  const int64_t lse_rows = (s.q_len + 31) / 32 * 32;
  const auto [k_centred, lse_shifted, kbar] = centred_keys(
      q, k, lse, call.scale, gpu::CentringPolicy::kAuto, reference::kCentringOffsetSpreadRatio, stream, lse_rows);
  const int64_t group = s.q_heads / s.kv_heads;
  const at::Tensor k_heads = group == 1 ? k_centred : k_centred.repeat_interleave(group, 1);
  const at::Tensor v_heads = group == 1 ? v : v.repeat_interleave(group, 1);
  const at::Tensor bias = attn_mask.has_value() ? efficient_bias(*attn_mask, call, q) : at::Tensor();
  const auto grads = at::_scaled_dot_product_efficient_attention_backward(
      grad_out, q, k_heads, v_heads, bias, out, lse_shifted, philox_seed, philox_offset, 0.0,
      std::array<bool, 4>{true, true, true, false}, causal, call.scale);
  if (group == 1) return {std::get<0>(grads), std::get<1>(grads), std::get<2>(grads)};
  auto per_kv = [&](const at::Tensor& x) {
    return x.unflatten(1, {s.kv_heads, group}).sum(2, false, at::kFloat).to(x.scalar_type());
  };
  return {std::get<0>(grads), per_kv(std::get<1>(grads)), per_kv(std::get<2>(grads))};
}

void register_cuda_center(torch::Library& m) { m.impl("center_keys", &center_keys_cuda); }

}  // namespace gaugewatch::torch_ops
