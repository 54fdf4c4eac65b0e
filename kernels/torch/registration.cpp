// The gaugewatch torch op schemas, declared once. Backend files only m.impl:
//   ops_cpu.cpp   CPU: every backend through the CPU reference (kernels/reference)
//   ops_cuda.cpp  CUDA: backend "fp32" through the fused FP32 kernel (kernels/cuda)
//   ops_meta.cpp  Meta / fake tensors: output shapes and dtypes only
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
//   projection; outputs bfloat16), "fp32" (FP32 recompute from q, k, v, grad_out:
//   out and lse are not used; outputs float32; center_keys subtracts each kv
//   head's mean key first, which leaves the exact gradients unchanged and removes
//   most of the FP32 floor on offset keys), "fp64" (CPU only, float64 truth).
//   deterministic: bitwise repeatable results (CUDA fp32: no dQ atomics).
//
// attention_backward_rows(grad_out, q, k, v, out, lse, slices, rows, *, ...)
//   The FP32 recompute on a sample, as the monitor runs it: slices are flat
//   b * Hq + h indices, rows are query rows along N (the same for each slice).
//   Returns dq of the chosen rows (S, R, d) float32, and dk, dv (B, Hkv, M, d)
//   float32 holding the contributions of only the chosen rows. The softmax of a
//   chosen row still sees every key the row sees.
//
// attention_metrics(grad_out, q, k, v, out, lse, *, ...) -> Tensor
//   The NUMERICS.md metrics of one call as a float64 vector in the order of
//   kernels/reference/metric_catalogue.h; "live" is the stock fused BF16 numerics
//   (backend bf16). metric_names() -> str[] gives the names in the same order.
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
      "bool center_keys=True) -> (Tensor, Tensor, Tensor)");
  m.def(
      "attention_backward_rows(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor slices, Tensor rows, *, bool is_causal=False, float? scale=None, "
      "str causal_alignment=\"top_left\", Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
      "bool deterministic=False, bool center_keys=True) -> (Tensor, Tensor, Tensor)");
  m.def(
      "attention_metrics(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, *, "
      "bool is_causal=False, float? scale=None, str causal_alignment=\"top_left\", "
      "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None) -> Tensor");
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
