#include "hooks/gaugewatch_backends.h"

#include <ATen/ops/all.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "hooks/center_backend.h"
#include "hooks/log.h"
#include "hooks/torch_errors.h"

namespace gaugewatch::hooks {
namespace {

using at::Tensor;

// Whether gaugewatch::attention_backward runs `backend` on CUDA: probed once
// per (backend, device) at its first use by a tiny call of the op (B = H = 1,
// N = M = 16, the call's head dim, causal) on the current stream; nullopt:
// it ran and returned BF16 gradients of the operands' shapes; otherwise why
// not (the op's c10::Error, without its backtrace). The result is logged and
// kept in the stats ("cuda_backends").
std::optional<std::string> cuda_backend_refusal(Backend backend, const Tensor& like) {
  static std::mutex* mu = new std::mutex;
  static auto* results = new std::map<std::pair<int, int>, std::optional<std::string>>();
  const std::pair<int, int> key{static_cast<int>(backend), static_cast<int>(like.device().index())};
  std::lock_guard lock(*mu);
  if (auto it = results->find(key); it != results->end()) return it->second;
  const std::string b(backend_name(backend));
  std::optional<std::string> why;
  if (const std::string missing = op_unavailable("attention_backward"); !missing.empty()) {
    why = missing;
  } else {
    try {
      const at::AutoDispatchBelowADInplaceOrView below;
      const auto bf16 = like.options().dtype(at::kBFloat16);
      const std::int64_t n = 16, d = like.size(-1);
      // q = k = 0: causal row i attends uniformly to its i + 1 keys, so
      // out = v's mean = 1 and lse = log(i + 1): a consistent forward.
      const Tensor q = at::zeros({1, 1, n, d}, bf16), k = at::zeros({1, 1, n, d}, bf16);
      const Tensor v = at::ones({1, 1, n, d}, bf16), o = at::ones({1, 1, n, d}, bf16);
      const Tensor grad = at::ones({1, 1, n, d}, bf16);
      const Tensor lse = at::arange(1, n + 1, like.options().dtype(at::kFloat)).log().view({1, 1, n});
      auto [dq, dk, dv] = grads_of(call_op("attention_backward", {{"grad_out", grad}, {"q", q}, {"k", k},
                                                                  {"v", v}, {"out", o}, {"lse", lse},
                                                                  {"is_causal", true}, {"backend", b}}));
      if (!dq.defined() || dq.sizes() != q.sizes() || dk.sizes() != k.sizes() || dv.sizes() != v.sizes() ||
          dq.scalar_type() != at::kBFloat16 || !dq.is_cuda()) {
        why = "the op returned " + std::string(dq.defined() ? c10::toString(dq.scalar_type()) : "nothing") +
              " gradients of unexpected shape or device";
      }
    } catch (const c10::Error& e) {
      why = "the op refused: " + short_what(e);
    } catch (const std::exception& e) {
      why = "the op failed: " + short_what(e);
    }
  }
  results->emplace(key, why);
  log_line("CUDA backend " + b + " on device " + std::to_string(key.second) + ": " +
           (why ? "unavailable (" + *why + "); layers switched to it run stock" : "available"));
  try {
    runtime().set_backend_status(b, why ? "unavailable: " + *why : "available");
  } catch (const std::exception&) {
  }
  return why;
}

}  // namespace

std::optional<std::array<Tensor, 4>> gaugewatch_backward(const CallInfo& info, Backend backend,
                                                         const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                                         const Tensor& v, const Tensor& out, const Tensor& lse) {
  const std::string b(backend_name(backend));
  auto refuse = [&](const std::string& why) -> std::optional<std::array<Tensor, 4>> {
    log_once("refuse:" + b + ":" + why, "backend " + b + " cannot run for " + op_name(info.kind) + " (" + why +
                                            "): stock backward instead (logged once)");
    return std::nullopt;
  };
  if (backend == Backend::kCenter) {
    std::string why;
    if (auto g = center_backward(info, grad_out, q, k, v, out, lse, &why)) return g;
    return refuse(why);
  }
  // The op computes in the training dtype: bfloat16. A trainer that runs its
  // attention in float16 or float32 gets stock numerics from the backends'
  // point of view, so they do not apply (no cast: that would change numerics).
  if (q.scalar_type() != at::kBFloat16 || k.scalar_type() != at::kBFloat16 || v.scalar_type() != at::kBFloat16) {
    return refuse(std::string("the trainer runs ") + c10::toString(q.scalar_type()) +
                  " attention; the gaugewatch backends apply to bfloat16 training only");
  }
  if (grad_out.scalar_type() != at::kBFloat16) {
    return refuse(std::string("grad_out is ") + c10::toString(grad_out.scalar_type()) + ", not bfloat16");
  }
  if (info.dropout_p != 0.0) return refuse("dropout");
  if ((info.attn_mask.has_value() && info.attn_mask->defined()) || info.attn_bias.defined()) {
    return refuse("attention mask / bias");
  }
  if (info.cum_seq_q.defined() || q.is_nested()) return refuse("packed / nested sequences");
  if (q.dim() != 4 || k.dim() != 4) return refuse("not (B, H, N, d)");
  // cuDNN's lse is (B, H, N, 1), efficient attention's padded: the ops take (B, H, N).
  const Tensor lse3 = canonical_lse(lse, q.size(2)).contiguous();
  if (lse3.dim() != 3 || lse3.size(2) != q.size(2)) return refuse("log-sum-exp not (B, H, N)");
  if (const std::string missing = op_unavailable("attention_backward"); !missing.empty()) return refuse(missing);
  if (q.is_cuda()) {
    // The fused BF16 backends are probed; fp32 (a separate FP32 kernel, no head-dim or arch limits) is not.
    if (backend != Backend::kFp32) {
      if (auto why = cuda_backend_refusal(backend, q)) return refuse("CUDA: " + *why);
    }
  } else {
    // NaN / Inf operands: stock takes such a call on the CPU (the reference
    // backends survive them, but their gradients would only carry the NaN
    // further; the check costs nothing here, while on CUDA it would
    // synchronize the training stream).
    for (const Tensor* t : {&q, &k, &v, &grad_out, &out}) {
      if (!at::isfinite(*t).all().item<bool>()) return refuse("non-finite inputs");
    }
    if (!at::isfinite(lse3).all().item<bool>()) return refuse("non-finite inputs");
  }
  try {
    // grad_out as autograd hands it over (SDPA's transposed layout): the op
    // reads strided rows in place, a copy here would cost a pass over it.
    auto [dq, dk, dv] = grads_of(call_op("attention_backward",
                                         {{"grad_out", grad_out}, {"q", q}, {"k", k}, {"v", v},
                                          {"out", out}, {"lse", lse3}, {"is_causal", info.is_causal},
                                          {"scale", info.scale}, {"backend", b}}));
    // CPU: a non-finite gradient runs stock instead. CUDA: not checked (the
    // check would synchronize the training stream); stock would pass the same
    // non-finite inputs on, and a sampled call's audit skips them.
    if (!q.is_cuda()) {
      const bool finite = at::isfinite(dq).all().item<bool>() && at::isfinite(dk).all().item<bool>() &&
                          at::isfinite(dv).all().item<bool>();
      if (!finite) return refuse("non-finite gradient");
    }
    return std::array<Tensor, 4>{stock_grad_layout(dq, q, info.kind), stock_grad_layout(dk, k, info.kind),
                                 stock_grad_layout(dv, v, info.kind), Tensor()};
  } catch (const std::exception& e) {
    return refuse(std::string("error: ") + short_what(e));
  }
}

}  // namespace gaugewatch::hooks
