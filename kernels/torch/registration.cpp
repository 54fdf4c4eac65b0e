// The gaugewatch torch op schemas, declared once. Backend files only m.impl:
//   ops_cpu.cpp   CPU: every backend through the CPU reference (kernels/reference)
//   ops_cuda.cpp  CUDA: backend "fp32" through the fused FP32 kernel (kernels/cuda)
//   ops_meta.cpp  Meta / fake tensors: output shapes, dtypes and strides only
// Load from Python with torch.ops.load_library("build/lib/libgaugewatch_ops.so"),
// then call torch.ops.gaugewatch.<op>.
//
// attention_backward(grad_out, q, k, v, out, lse, *, ...) -> (dq, dk, dv)
//   SDPA layout: q, grad_out, out (B, Hq, N, d) bfloat16; k, v (B, Hkv, M, d)
//   bfloat16; lse (B, Hq, N) float32, natural log, as SDPA's flash op saves it.
//   GQA/MQA when Hkv divides Hq (query head h uses kv head h / (Hq / Hkv)).
//   is_causal with causal_alignment "top_left" (SDPA) or "bottom_right"
//   (FlashAttention). scale defaults to 1 / sqrt(d). cu_seqlens_q / _k: S + 1
//   offsets into N / M for packed sequences (FlashAttention varlen), applied to
//   every batch element.
//   backend: "gproj" | "pivot" | "bf16" (fused BF16 backward with / without a
//   projection; outputs bfloat16), "center" (the stock backward on centred keys,
//   see center_keys below; outputs bfloat16), "fp32" (FP32 recompute from q, k, v, grad_out:
//   out and lse are not used; outputs float32; center_keys subtracts each kv
//   head's mean key first, which leaves the exact gradients unchanged and removes
//   most of the FP32 floor on offset keys), "fp64" (CPU only, float64 truth).
//   dq, dk, dv: dense, each in the stride order of q, k, v (kernels/torch/stride_order.h:
//     contiguous for contiguous operands, (B, N, H, d)-transposed for SDPA's views), on
//     every device and backend; the CUDA fused BF16 kernels write them in place.
//   deterministic: bitwise repeatable results (CUDA fp32: no dQ atomics; CUDA bf16 and pivot: the
//     two-kernel pair instead of the key-outer kernel; CUDA gproj runs the key-outer
//     kernels, at head dim 128 where they run warp-specialized, unless
//     GAUGEWATCH_GPROJ_KERNEL says otherwise).
//
// attention_backward_rows(grad_out, q, k, v, out, lse, slices, rows, *, ...)
//   The FP32 recompute on a sample, as the monitor runs it: slices are flat
//   b * Hq + h indices, rows are query rows along N (the same for each slice).
//   Returns dq of the chosen rows (S, R, d) float32, and dk, dv (B, Hkv, M, d)
//   float32 holding the contributions of only the chosen rows. The softmax of a
//   chosen row still sees every key the row sees.
//
// attention_metrics(grad_out, q, k, v, out, lse, *, ...) -> Tensor
//   The docs/numerics.md metrics of one call as a float64 vector in the order of
//   kernels/reference/metric_catalogue.h; "live" is the stock fused BF16 numerics
//   (backend bf16). metric_names() -> str[] gives the names in the same order.
//
// attn_mask (keyword, all three ops): None, or SDPA's attn_mask: bool (True =
//   the pair takes part) or a floating additive bias added to the scaled scores,
//   any shape broadcastable to (B, Hq, N, M) (stride-0 views included), on q's
//   device. Combined with is_causal / cu_seqlens, a pair takes part when both
//   allow it. A row whose every key is masked (bool False or bias -inf) gives
//   what SDPA's CPU math and flash paths give: output 0 and zero gradients for
//   that row (its lse is not read).
//
// center_keys(q, k, lse, *, scale=None, policy="auto") -> (k_centred, lse_shifted, kbar)
//   Key centring (docs/numerics.md, Key centring): q (B, Hq, N, d), k (B, Hkv, M,
//   d) in bfloat16, float16 or float32 (same dtype); lse (B, Hq, L) float32 with
//   L >= N (entries >= N are returned unchanged: the efficient op pads lse).
//   kbar (B, Hkv, d) in k's dtype, on its grid: per (b, kv head) and coordinate
//   c, with m_c the mean and s_c the RMS deviation of k[b, hk, :, c] over all M
//   keys, kbar_c = round(m_c) where the policy centres c, else 0:
//     "auto"    centre c where |m_c| > 2 s_c (the offset dominates the spread:
//               the leak it removes exceeds the rounding of K - kbar it adds);
//     "always"  centre every coordinate;  "never"  kbar = 0.
//   k_centred = round(k - kbar) in k's dtype (exact where the offset dominates);
//   lse_shifted[b, h, i] = lse[b, h, i] - scale * q[b, h, i] . kbar[b, h / (Hq / Hkv)]
//   in float32 for i < N. scale defaults to 1 / sqrt(d). The softmax is unchanged,
//   so any stock backward on (q, k_centred, v, out, lse_shifted) returns the same
//   gradients mathematically, with the rounded row mass multiplying the centred keys.
//   backend "center" of attention_backward: the device's stock backward (CPU: the
//   CPU flash backward) on center_keys' outputs (policy "auto"); outputs bfloat16.
//
// A fragment (not TORCH_LIBRARY) so that other gaugewatch libraries, such as
// the hooks, can add ops of their own to the namespace. Registration is done
// by one static registrar rather than the TORCH_LIBRARY macros, so that a
// second copy of this library (another build, another path) finds the ops
// already defined and stays inert: a duplicate definition would throw during
// static initialization and abort the trainer.

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "kernels/reference/metric_catalogue.h"
#include "kernels/torch/registration.h"

namespace gaugewatch::torch_ops {
namespace {

std::vector<std::string> metric_names() {
  std::vector<std::string> names;
  for (const auto& spec : reference::metric_catalogue()) names.emplace_back(spec.name);
  return names;
}

void define_ops(torch::Library& m) {
  m.def(
      "attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, *, "
      "bool is_causal=False, float? scale=None, str backend=\"gproj\", str causal_alignment=\"top_left\", "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, bool deterministic=False, "
      "bool center_keys=True, Tensor? attn_mask=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "attention_backward_rows(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor slices, Tensor rows, *, bool is_causal=False, float? scale=None, "
      "str causal_alignment=\"top_left\", Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
      "bool deterministic=False, bool center_keys=True, Tensor? attn_mask=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "attention_metrics(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, *, "
      "bool is_causal=False, float? scale=None, str causal_alignment=\"top_left\", "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? attn_mask=None) -> Tensor");
  m.def(
      "center_keys(Tensor q, Tensor k, Tensor lse, *, float? scale=None, str policy=\"auto\") "
      "-> (Tensor k_centred, Tensor lse_shifted, Tensor kbar)");
  // No tensor arguments, so no dispatch key: one kernel for every caller.
  m.def("metric_names() -> str[]", &metric_names);
}

// The libraries live as long as the process (this shared object is never
// unloaded while torch holds its kernels).
class Registrar {
 public:
  Registrar() {
    // Nothing may escape a static initializer of a library loaded into a trainer.
    try {
      register_all();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[gaugewatch] registering torch.ops.gaugewatch failed: %s\n", e.what());
    }
  }

 private:
  void register_all() {
    if (c10::Dispatcher::singleton().findSchema({"gaugewatch::attention_backward", ""}).has_value()) {
      std::fprintf(stderr,
                   "[gaugewatch] torch.ops.gaugewatch is already registered by another copy of "
                   "libgaugewatch_ops.so; this copy stays inert\n");
      return;
    }
    defs_ = std::make_unique<torch::Library>(torch::Library::FRAGMENT, "gaugewatch", std::nullopt, __FILE__,
                                             __LINE__);
    define_ops(*defs_);
    cpu_ = make_impl(c10::DispatchKey::CPU);
    register_cpu_kernels(*cpu_);
    meta_ = make_impl(c10::DispatchKey::Meta);
    register_meta_kernels(*meta_);
#ifdef GAUGEWATCH_OPS_CUDA
    cuda_ = make_impl(c10::DispatchKey::CUDA);
    register_cuda_kernels(*cuda_);
#endif
  }

  static std::unique_ptr<torch::Library> make_impl(c10::DispatchKey key) {
    return std::make_unique<torch::Library>(torch::Library::IMPL, "gaugewatch", key, __FILE__, __LINE__);
  }
  std::unique_ptr<torch::Library> defs_, cpu_, meta_, cuda_;
};

const Registrar kRegistrar;

}  // namespace

}  // namespace gaugewatch::torch_ops
