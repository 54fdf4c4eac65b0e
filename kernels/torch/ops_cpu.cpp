// CPU implementations of the gaugewatch ops: every backend delegates to the
// CPU reference (kernels/reference), so the same op tests run in CI without a
// GPU. Schemas and semantics: kernels/torch/registration.cpp.

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/reference/attention_problem.h"
#include "kernels/reference/exact_attention.h"
#include "kernels/reference/fp32_backward.h"
#include "kernels/reference/fused_backward_bf16.h"
#include "kernels/reference/key_centring.h"
#include "kernels/reference/metrics.h"
#include "kernels/torch/attention_call.h"
#include "kernels/torch/attention_mask.h"
#include "kernels/torch/center_keys_call.h"
#include "kernels/torch/registration.h"
#include "kernels/torch/stride_order.h"

namespace gaugewatch::torch_ops {
namespace {

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// Reference errors (std::invalid_argument) become TORCH_CHECK errors.
template <typename Fn>
auto guarded(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "gaugewatch: ", e.what());
  }
}

std::vector<float> to_floats(const at::Tensor& t) {
  const at::Tensor f = t.to(at::kFloat).contiguous();
  const float* p = f.data_ptr<float>();
  return std::vector<float>(p, p + f.numel());
}

std::vector<int64_t> to_offsets(const at::Tensor& t) {
  const at::Tensor l = t.to(at::kLong).contiguous();
  const int64_t* p = l.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + l.numel());
}

void check_cpu(const at::Tensor& q, const std::optional<at::Tensor>& cu_q, const std::optional<at::Tensor>& cu_k) {
  TORCH_CHECK(q.device().is_cpu(), "gaugewatch: CPU kernel called with q on ", q.device());
  if (cu_q.has_value()) {
    TORCH_CHECK(cu_q->device().is_cpu() && cu_k->device().is_cpu(),
                "gaugewatch: cu_seqlens must be CPU tensors for CPU inputs");
  }
}

// attn_mask as the reference's additive bias: bool True / False -> 0 / -inf,
// a floating mask as float. A broadcast (stride-0) dimension is read once, so
// an expanded view is not materialized.
reference::AttentionBias to_bias(const at::Tensor& attn_mask) {
  at::Tensor m = attn_mask;
  while (m.dim() < 4) m = m.unsqueeze(0);
  for (int64_t i = 0; i < 4; ++i) {
    if (m.size(i) > 1 && m.stride(i) == 0) m = m.narrow(i, 0, 1);
  }
  if (m.scalar_type() == at::kBool) {
    m = at::zeros(m.sizes(), m.options().dtype(at::kFloat)).masked_fill(m.logical_not(),
                                                                         -std::numeric_limits<float>::infinity());
  }
  reference::AttentionBias bias;
  bias.values = to_floats(m);
  for (int64_t i = 0; i < 4; ++i) bias.sizes[static_cast<size_t>(i)] = m.size(i);
  return bias;
}

reference::AttentionInputs make_inputs(const AttentionCall& call, const at::Tensor& grad_out, const at::Tensor& q,
                                       const at::Tensor& k, const at::Tensor& v,
                                       const std::optional<at::Tensor>& cu_q,
                                       const std::optional<at::Tensor>& cu_k,
                                       const std::optional<at::Tensor>& attn_mask) {
  reference::AttentionInputs in;
  in.shape = call.shape;
  in.causal = call.causal;
  in.scale = call.scale;
  in.q = to_floats(q);
  in.k = to_floats(k);
  in.v = to_floats(v);
  in.grad_out = to_floats(grad_out);
  if (call.packed) {
    in.cu_seqlens_q = to_offsets(*cu_q);
    in.cu_seqlens_k = to_offsets(*cu_k);
  }
  if (attn_mask.has_value()) in.bias = to_bias(*attn_mask);
  guarded([&] {
    in.validate();
    return 0;
  });
  return in;
}

reference::SavedForward make_saved(const at::Tensor& out, const at::Tensor& lse) {
  return reference::SavedForward{to_floats(out), to_floats(lse)};
}

template <typename T>
at::Tensor to_tensor(const std::vector<T>& values, at::IntArrayRef sizes, c10::ScalarType dtype) {
  const auto source = std::is_same_v<T, double> ? at::kDouble : at::kFloat;
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(source));
  TORCH_INTERNAL_ASSERT(t.numel() == static_cast<int64_t>(values.size()));
  std::copy(values.begin(), values.end(), t.data_ptr<T>());
  return t.to(dtype);
}

float round_to_bfloat16(float x) { return static_cast<float>(c10::BFloat16(x)); }
float round_to_half(float x) { return static_cast<float>(c10::Half(x)); }
float keep_float(float x) { return x; }

reference::GridRounding grid_of(c10::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return &round_to_bfloat16;
    case at::kHalf: return &round_to_half;
    default: return &keep_float;
  }
}

// kbar from the reference's criterion (kernels/reference/key_centring.h), the
// centred keys and the shifted lse with ATen ops.
std::tuple<at::Tensor, at::Tensor, at::Tensor> center_keys_cpu(const at::Tensor& q, const at::Tensor& k,
                                                               const at::Tensor& lse, std::optional<double> scale,
                                                               c10::string_view policy) {
  const CenterKeysCall call = check_center_keys(q, k, lse, scale, policy);
  TORCH_CHECK(q.device().is_cpu(), "gaugewatch: CPU kernel called with q on ", q.device());
  const std::vector<float> keys = to_floats(k);
  const int64_t d = call.head_dim, pairs = call.batch * call.kv_heads;
  std::vector<float> kbar(static_cast<size_t>(pairs * d));
  const reference::GridRounding grid = grid_of(k.scalar_type());
  for (int64_t pair = 0; pair < pairs; ++pair) {
    reference::choose_kbar(&keys[static_cast<size_t>(pair * call.kv_len * d)], call.kv_len, d, call.policy, grid,
                           &kbar[static_cast<size_t>(pair * d)]);
  }
  const int64_t kbar_sizes[] = {call.batch, call.kv_heads, d};
  const at::Tensor kbar_f = to_tensor(kbar, kbar_sizes, at::kFloat);
  // Differences of two values of k's grid are exact in float; one rounding back.
  const at::Tensor k_centred =
      empty_in_stride_order(k, k.options()).copy_((k.to(at::kFloat) - kbar_f.unsqueeze(2)).to(k.scalar_type()));
  // q . kbar in FP64 (exact for BF16 and FP16 operands), then FP32, as the
  // CUDA kernel computes it (kernels/cuda/key_centring.h): the two agree bit for bit.
  const at::Tensor kbar_per_q_head = kbar_f.to(at::kDouble).repeat_interleave(call.q_heads / call.kv_heads, 1);
  const at::Tensor dot = at::matmul(q.to(at::kDouble), kbar_per_q_head.unsqueeze(3)).squeeze(3).to(at::kFloat);
  const at::Tensor shift = at::mul(dot, static_cast<float>(call.scale));
  at::Tensor lse_shifted = lse.clone();
  lse_shifted.narrow(2, 0, call.q_len).sub_(shift);
  return {k_centred, lse_shifted, kbar_f.to(k.scalar_type())};
}

// The visibility a causal alignment or packing imposes, as a bool (N, M) mask,
// combined with attn_mask; std::nullopt when neither applies. is_causal_native
// says whether the CPU flash op's own is_causal expresses the causal part.
struct FlashMasking {
  std::optional<at::Tensor> mask;
  bool is_causal = false;
};

FlashMasking flash_masking(const AttentionCall& call, const at::Tensor& q,
                           const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
                           const std::optional<at::Tensor>& attn_mask) {
  const auto& sh = call.shape;
  const bool structural = call.packed || call.causal != reference::CausalMode::kNone;
  if (!structural) return {attn_mask, false};
  if (!call.packed && call.causal == reference::CausalMode::kTopLeft && !attn_mask.has_value()) return {{}, true};
  // Row n sees keys [begin, end) from the reference's single definition.
  reference::AttentionInputs layout;
  layout.shape = sh;
  layout.causal = call.causal;
  if (call.packed) {
    layout.cu_seqlens_q = to_offsets(*cu_seqlens_q);
    layout.cu_seqlens_k = to_offsets(*cu_seqlens_k);
  }
  at::Tensor visible = at::zeros({sh.q_len, sh.kv_len}, q.options().dtype(at::kBool));
  for (int64_t n = 0; n < sh.q_len; ++n) {
    const reference::KeyRange keys = reference::visible_keys(layout, n);
    if (keys.size() > 0) visible[n].narrow(0, keys.begin, keys.size()).fill_(true);
  }
  if (!attn_mask.has_value()) return {visible, false};
  if (attn_mask->scalar_type() == at::kBool) return {at::logical_and(*attn_mask, visible), false};
  return {attn_mask->masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity()), false};
}

// backend "center": the CPU flash backward (the stock CPU backward) on the
// centred keys and the shifted lse. The mask goes to it as an additive bias
// in q's dtype, as SDPA hands it over (the CPU flash op reads a bool mask as
// numbers: SDPA converts bool masks to 0 / -inf before calling it).
Grads center_backward_cpu(const AttentionCall& call, const at::Tensor& grad_out, const at::Tensor& q,
                          const at::Tensor& k, const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                          const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
                          const std::optional<at::Tensor>& attn_mask) {
  const auto [k_centred, lse_shifted, kbar] = center_keys_cpu(q, k, lse, call.scale, "auto");
  FlashMasking masking = flash_masking(call, q, cu_seqlens_q, cu_seqlens_k, attn_mask);
  if (masking.mask.has_value()) {
    const at::Tensor& m = *masking.mask;
    masking.mask = m.scalar_type() == at::kBool
                       ? at::zeros({}, q.options()).masked_fill(m.logical_not(), -std::numeric_limits<float>::infinity())
                       : m.to(q.scalar_type());
  }
  return at::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k_centred, v, out, lse_shifted,
                                                                  /*dropout_p=*/0.0, masking.is_causal, masking.mask,
                                                                  call.scale);
}

// Every backend's gradients in the reference's (B, H, L, d) order, or for
// center in the CPU flash backward's (B, N, H, d)-transposed layout.
Grads backward_cpu(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& out, const at::Tensor& lse, bool is_causal, std::optional<double> scale,
                   c10::string_view backend_name_arg, c10::string_view causal_alignment,
                   const std::optional<at::Tensor>& cu_seqlens_q, const std::optional<at::Tensor>& cu_seqlens_k,
                   bool center_keys, const std::optional<at::Tensor>& attn_mask) {
  const AttentionCall call = check_attention_call(grad_out, q, k, v, out, lse, is_causal, scale, causal_alignment,
                                                  cu_seqlens_q, cu_seqlens_k);
  const Backend backend = parse_backend(backend_name_arg);
  check_cpu(q, cu_seqlens_q, cu_seqlens_k);
  check_attn_mask(attn_mask, call, q);
  if (backend == Backend::kCenter) {
    return center_backward_cpu(call, grad_out, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, attn_mask);
  }
  const reference::AttentionInputs in = make_inputs(call, grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, attn_mask);
  const c10::ScalarType dtype = backend_dtype(backend);
  // The reference is deterministic already: `deterministic` changes nothing here.
  switch (backend) {
    case Backend::kFp64: {
      const reference::ExactAttention e = guarded([&] { return reference::attention_fp64(in); });
      return {to_tensor(e.dq, q.sizes(), dtype), to_tensor(e.dk, k.sizes(), dtype), to_tensor(e.dv, k.sizes(), dtype)};
    }
    case Backend::kFp32: {
      const reference::Gradients g =
          guarded([&] { return reference::backward_fp32(in, reference::Fp32BackwardOptions{center_keys}); });
      return {to_tensor(g.dq, q.sizes(), dtype), to_tensor(g.dk, k.sizes(), dtype), to_tensor(g.dv, k.sizes(), dtype)};
    }
    default: {
      const reference::SavedForward saved = make_saved(out, lse);
      const reference::FusedBackward fused = guarded([&] { return reference::backward_fused_bf16(in, saved); });
      const reference::Gradients& g =
          backend == Backend::kGproj ? fused.gproj : (backend == Backend::kPivot ? fused.pivot : fused.plain);
      return {to_tensor(g.dq, q.sizes(), dtype), to_tensor(g.dk, k.sizes(), dtype), to_tensor(g.dv, k.sizes(), dtype)};
    }
  }
}

// The gradients as the CUDA kernels write them (and the Meta kernel says):
// dense in the stride order of q, k, v (a copy here, where that is not the
// reference's or the CPU flash backward's layout).
Grads attention_backward_cpu(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool is_causal,
                             std::optional<double> scale, c10::string_view backend_name,
                             c10::string_view causal_alignment, const std::optional<at::Tensor>& cu_seqlens_q,
                             const std::optional<at::Tensor>& cu_seqlens_k, bool /*deterministic*/,
                             bool center_keys, const std::optional<at::Tensor>& attn_mask) {
  return in_operand_order(backward_cpu(grad_out, q, k, v, out, lse, is_causal, scale, backend_name, causal_alignment,
                                       cu_seqlens_q, cu_seqlens_k, center_keys, attn_mask),
                          q, k, v);
}

// dq of a chosen row depends only on that row's grad_out, and a row whose
// grad_out is zero adds nothing to dk or dv (a_ij = delta_i = 0): so the FP32
// reference on grad_out masked to the chosen rows gives both the chosen rows'
// dq and the chosen rows' share of dk and dv.
Grads attention_backward_rows_cpu(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                  const at::Tensor& slices, const at::Tensor& rows, bool is_causal,
                                  std::optional<double> scale, c10::string_view causal_alignment,
                                  const std::optional<at::Tensor>& cu_seqlens_q,
                                  const std::optional<at::Tensor>& cu_seqlens_k, bool /*deterministic*/,
                                  bool center_keys, const std::optional<at::Tensor>& attn_mask) {
  const AttentionCall call = check_attention_call(grad_out, q, k, v, out, lse, is_causal, scale, causal_alignment,
                                                  cu_seqlens_q, cu_seqlens_k);
  check_cpu(q, cu_seqlens_q, cu_seqlens_k);
  check_attn_mask(attn_mask, call, q);
  check_row_subset(call, slices, rows, q);
  reference::AttentionInputs in = make_inputs(call, grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, attn_mask);
  const auto& sh = in.shape;
  const std::vector<int64_t> chosen_slices = to_offsets(slices);
  const std::vector<int64_t> chosen_rows = to_offsets(rows);
  std::vector<char> keep(static_cast<size_t>(sh.q_rows()), 0);
  for (int64_t s : chosen_slices) {
    for (int64_t n : chosen_rows) keep[static_cast<size_t>(s * sh.q_len + n)] = 1;
  }
  for (int64_t r = 0; r < sh.q_rows(); ++r) {
    if (!keep[static_cast<size_t>(r)]) {
      std::fill_n(in.grad_out.begin() + r * sh.head_dim, sh.head_dim, 0.0f);
    }
  }
  const reference::Gradients g =
      guarded([&] { return reference::backward_fp32(in, reference::Fp32BackwardOptions{center_keys}); });
  std::vector<float> dq;
  dq.reserve(chosen_slices.size() * chosen_rows.size() * static_cast<size_t>(sh.head_dim));
  for (int64_t s : chosen_slices) {
    for (int64_t n : chosen_rows) {
      const auto first = g.dq.begin() + (s * sh.q_len + n) * sh.head_dim;
      dq.insert(dq.end(), first, first + sh.head_dim);
    }
  }
  const int64_t dq_sizes[] = {static_cast<int64_t>(chosen_slices.size()), static_cast<int64_t>(chosen_rows.size()),
                              sh.head_dim};
  return {to_tensor(dq, dq_sizes, at::kFloat), to_tensor(g.dk, k.sizes(), at::kFloat),
          to_tensor(g.dv, k.sizes(), at::kFloat)};
}

at::Tensor attention_metrics_cpu(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse, bool is_causal,
                                 std::optional<double> scale, c10::string_view causal_alignment,
                                 const std::optional<at::Tensor>& cu_seqlens_q,
                                 const std::optional<at::Tensor>& cu_seqlens_k,
                                 const std::optional<at::Tensor>& attn_mask) {
  const AttentionCall call = check_attention_call(grad_out, q, k, v, out, lse, is_causal, scale, causal_alignment,
                                                  cu_seqlens_q, cu_seqlens_k);
  check_cpu(q, cu_seqlens_q, cu_seqlens_k);
  check_attn_mask(attn_mask, call, q);
  const reference::AttentionInputs in = make_inputs(call, grad_out, q, k, v, cu_seqlens_q, cu_seqlens_k, attn_mask);
  const reference::SavedForward saved = make_saved(out, lse);
  const reference::AttentionMetrics metrics = guarded([&] {
    const reference::FusedBackward fused = reference::backward_fused_bf16(in, saved);
    const reference::Gradients fp32 = reference::backward_fp32(in);
    return reference::compute_metrics(in, saved, fused, fp32);
  });
  const std::vector<double> values(metrics.values.begin(), metrics.values.end());
  const int64_t sizes[] = {static_cast<int64_t>(values.size())};
  return to_tensor(values, sizes, at::kDouble);
}

}  // namespace

void register_cpu_kernels(torch::Library& m) {
  m.impl("attention_backward", &attention_backward_cpu);
  m.impl("attention_backward_rows", &attention_backward_rows_cpu);
  m.impl("attention_metrics", &attention_metrics_cpu);
  m.impl("center_keys", &center_keys_cpu);
}

}  // namespace gaugewatch::torch_ops
