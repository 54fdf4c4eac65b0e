// The interceptor: kernels registered at the AutogradCPU / AutogradCUDA keys
// for SDPA's fused attention ops. Each one calls the stock forward below
// autograd, wraps it in a torch::autograd::Function whose backward runs the
// layer's backend (runtime.h decides which), and hands sampled calls to the
// auditor. Ops taken over (schemas: torch 2.11, see FINDINGS.md):
//   AutogradCPU   aten::_scaled_dot_product_flash_attention_for_cpu
//   AutogradCUDA  aten::_scaled_dot_product_flash_attention
//                 aten::_scaled_dot_product_cudnn_attention
//                 aten::_scaled_dot_product_efficient_attention
// The backward of backend "stock" is the op's own backward, called exactly as
// PyTorch's derivatives.yaml does. Other backends call
// gaugewatch::attention_backward (libgaugewatch_ops); any failure there (no
// kernel for the device, dtype not BF16, dropout or a mask, non-finite
// result) logs once and runs stock instead. Nothing here throws into the
// trainer beyond what the stock ops themselves would throw.
//
// Registration happens when the library is loaded (LD_PRELOAD,
// torch.ops.load_library, or linking). A second copy of the library finds the
// first one's gaugewatch_hooks::stats op, logs once and registers nothing.
// GAUGEWATCH_DISABLE=1 registers nothing either.
//
// Also defined here: the ops torch.ops.gaugewatch_hooks.* that the Python
// helper uses (stats, layer_names, begin_pass, enter_layer, exit_layer,
// flush, active).

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_ops.h>
#include <ATen/ops/all.h>
#include <ATen/ops/isfinite.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>
#include <torch/version.h>

#if defined(GAUGEWATCH_HOOKS_CUDA)
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "hooks/auditor.h"
#include "hooks/log.h"
#include "hooks/torch_errors.h"
#include "hooks/gaugewatch_hooks.h"
#include "hooks/runtime.h"

namespace gaugewatch::hooks {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Clock = std::chrono::steady_clock;

enum class OpKind { kCpuFlash, kCudaFlash, kCudnn, kEfficient };

const char* op_name(OpKind kind) {
  switch (kind) {
    case OpKind::kCpuFlash: return "_scaled_dot_product_flash_attention_for_cpu";
    case OpKind::kCudaFlash: return "_scaled_dot_product_flash_attention";
    case OpKind::kCudnn: return "_scaled_dot_product_cudnn_attention";
    case OpKind::kEfficient: return "_scaled_dot_product_efficient_attention";
  }
  return "?";
}

// Everything about one call that is not a differentiable tensor: the
// arguments, and the stock forward's extra outputs (undefined tensors and
// SymInts must not pass through the autograd Function: FINDINGS.md).
struct CallInfo : torch::CustomClassHolder {
  OpKind kind = OpKind::kCpuFlash;
  double dropout_p = 0.0;
  bool is_causal = false;
  std::optional<double> scale;
  std::optional<Tensor> attn_mask;  // CPU flash
  Tensor attn_bias;                 // cuDNN / efficient (undefined: none)
  bool return_debug_mask = false;
  bool compute_log_sumexp = true;
  std::array<bool, 4> grad_mask{true, true, true, false};
  // Extra outputs of the stock forward.
  Tensor cum_seq_q, cum_seq_k, philox_seed, philox_offset, debug_attn_mask;
  c10::SymInt max_q{0}, max_k{0};
  ForwardPlan plan;
};

bool in_backward() { return torch::autograd::get_current_graph_task_id() != -1; }

// --- the non-stock backends ------------------------------------------------
using Grads = std::tuple<Tensor, Tensor, Tensor>;
using BackwardFn = Grads(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         bool, std::optional<double>, c10::string_view, c10::string_view,
                         const std::optional<Tensor>&, const std::optional<Tensor>&, bool, bool,
                         const std::optional<Tensor>&);

std::optional<c10::TypedOperatorHandle<BackwardFn>> gaugewatch_backward_op() {
  static const std::optional<c10::TypedOperatorHandle<BackwardFn>> op =
      []() -> std::optional<c10::TypedOperatorHandle<BackwardFn>> {
    try {
      auto handle = c10::Dispatcher::singleton().findSchema({"gaugewatch::attention_backward", ""});
      if (!handle) return std::nullopt;
      return handle->typed<BackwardFn>();
    } catch (const std::exception& e) {
      log_line(std::string("gaugewatch::attention_backward has an unexpected schema: ") + short_what(e));
      return std::nullopt;
    }
  }();
  return op;
}

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
  auto op = gaugewatch_backward_op();
  if (!op) {
    why = "libgaugewatch_ops is not loaded";
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
      auto [dq, dk, dv] = op->call(grad, q, k, v, o, lse, true, std::nullopt, b, "top_left", std::nullopt,
                                   std::nullopt, false, true, std::nullopt);
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
    rt::set_backend_status(b, why ? "unavailable: " + *why : "available");
  } catch (const std::exception&) {
  }
  return why;
}

// The op's gradients as SDPA's backward returns them: the input's dtype and
// the stock backward's layout (torch 2.11). The CPU flash and the CUDA
// efficient backwards always allocate (B, N, H, d) and return it transposed,
// whatever the input's strides (efficient too for q, k, v sliced from one
// fused qkv buffer: the packed (B, N, 3, H, d) gradient of the lower-level
// _efficient_attention_backward is not what SDPA's op returns; measured on
// the H200, and its meta registration says the same); the CUDA flash and
// cuDNN ops allocate in the input's stride order (flash: empty_like of the
// (B, N, H, d)-transposed operand; cuDNN: alloc_with_matching_layout), so an
// SDPA-strided q,
// transposed from (B, N, H, d) or sliced from a fused qkv projection, gets a
// (B, N, H, d) transposed gradient and a contiguous q a contiguous one. The
// op returns contiguous tensors: copied only when the layouts differ.
Tensor like_input(const Tensor& grad, const Tensor& input, OpKind kind) {
  const std::int64_t dims = input.dim();
  std::vector<std::int64_t> order(static_cast<std::size_t>(dims));
  for (std::int64_t i = 0; i < dims; ++i) order[static_cast<std::size_t>(i)] = i;
  if ((kind == OpKind::kCpuFlash || kind == OpKind::kEfficient) && dims == 4) {
    order = {0, 2, 1, 3};
  } else {
    std::stable_sort(order.begin(), order.end(),
                     [&](std::int64_t a, std::int64_t b) { return input.stride(a) > input.stride(b); });
  }
  std::vector<std::int64_t> sizes(order.size()), inverse(order.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    sizes[i] = input.size(order[i]);
    inverse[static_cast<std::size_t>(order[i])] = static_cast<std::int64_t>(i);
  }
  Tensor target = at::empty(sizes, grad.options().dtype(input.scalar_type())).permute(inverse);
  if (grad.scalar_type() == input.scalar_type() && grad.strides() == target.strides()) return grad;
  target.copy_(grad);
  return target;
}

// The layer's backend, or nullopt (log once) when it cannot run for this call.
std::optional<Grads> gaugewatch_backward(const CallInfo& info, Backend backend, const Tensor& grad_out,
                                         const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                         const Tensor& lse) {
  const std::string b(backend_name(backend));
  auto refuse = [&](const std::string& why) -> std::optional<Grads> {
    log_once("refuse:" + b + ":" + why, "backend " + b + " cannot run for " + op_name(info.kind) + " (" + why +
                                            "): stock backward instead (logged once)");
    return std::nullopt;
  };
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
  auto op = gaugewatch_backward_op();
  if (!op) return refuse("libgaugewatch_ops is not loaded");
  if (q.is_cuda()) {
    // The fused BF16 backends are probed; fp32 (its kernel predates them) is not.
    if (backend != Backend::kFp32) {
      if (auto why = cuda_backend_refusal(backend, q)) return refuse("CUDA: " + *why);
    }
  } else {
    // NaN / Inf operands: stock takes such a call on the CPU (the reference
    // backends survive them since 7266c35, but their gradients would only
    // carry the NaN further; the check costs nothing here, while on CUDA it
    // would synchronize the training stream).
    for (const Tensor* t : {&q, &k, &v, &grad_out, &out}) {
      if (!at::isfinite(*t).all().item<bool>()) return refuse("non-finite inputs");
    }
    if (!at::isfinite(lse3).all().item<bool>()) return refuse("non-finite inputs");
  }
  try {
    auto [dq, dk, dv] = op->call(grad_out.contiguous(), q, k, v, out, lse3, info.is_causal, info.scale, b,
                                 "top_left", std::nullopt, std::nullopt, false, true, std::nullopt);
    // CPU: a non-finite gradient runs stock instead. CUDA: not checked (the
    // check would synchronize the training stream); stock would pass the same
    // non-finite inputs on, and a sampled call's audit skips them.
    if (!q.is_cuda()) {
      const bool finite = at::isfinite(dq).all().item<bool>() && at::isfinite(dk).all().item<bool>() &&
                          at::isfinite(dv).all().item<bool>();
      if (!finite) return refuse("non-finite gradient");
    }
    return Grads{like_input(dq, q, info.kind), like_input(dk, k, info.kind), like_input(dv, v, info.kind)};
  } catch (const std::exception& e) {
    return refuse(std::string("error: ") + short_what(e));
  }
}

// --- stock backwards, as derivatives.yaml calls them ------------------------
std::array<Tensor, 4> stock_backward(const CallInfo& i, const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                     const Tensor& v, const Tensor& out, const Tensor& lse) {
  switch (i.kind) {
    case OpKind::kCpuFlash: {
      auto [dq, dk, dv] = at::_ops::_scaled_dot_product_flash_attention_for_cpu_backward::call(
          grad_out, q, k, v, out, lse, i.dropout_p, i.is_causal, i.attn_mask, i.scale);
      return {dq, dk, dv, Tensor()};
    }
    case OpKind::kCudaFlash: {
      auto [dq, dk, dv] = at::_ops::_scaled_dot_product_flash_attention_backward::call(
          grad_out, q, k, v, out, lse, i.cum_seq_q, i.cum_seq_k, i.max_q, i.max_k, i.dropout_p, i.is_causal,
          i.philox_seed, i.philox_offset, i.scale);
      return {dq, dk, dv, Tensor()};
    }
    case OpKind::kCudnn: {
      auto [dq, dk, dv] = at::_ops::_scaled_dot_product_cudnn_attention_backward::call(
          grad_out, q, k, v, out, lse, i.philox_seed, i.philox_offset, i.attn_bias, i.cum_seq_q, i.cum_seq_k,
          i.max_q, i.max_k, i.dropout_p, i.is_causal, i.scale);
      return {dq, dk, dv, Tensor()};
    }
    case OpKind::kEfficient: {
      auto [dq, dk, dv, dbias] = at::_ops::_scaled_dot_product_efficient_attention_backward::call(
          grad_out, q, k, v, i.attn_bias, out, lse, i.philox_seed, i.philox_offset, i.dropout_p, i.grad_mask,
          i.is_causal, i.scale);
      return {dq, dk, dv, dbias};
    }
  }
  return {};
}

// --- the autograd Function ----------------------------------------------------
// Inputs: {q, k, v} or {q, k, v, bias} (a differentiable efficient-attention
// bias; undefined tensors cannot be Function inputs), info. Outputs: out, lse
// (lse non-differentiable).
struct AttentionImpl {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& bias, const c10::intrusive_ptr<CallInfo>& info) {
    at::AutoDispatchBelowADInplaceOrView below;
    CallInfo& i = *info;
    Tensor out, lse;
    switch (i.kind) {
      case OpKind::kCpuFlash:
        std::tie(out, lse) = at::_ops::_scaled_dot_product_flash_attention_for_cpu::call(
            q, k, v, i.dropout_p, i.is_causal, i.attn_mask, i.scale);
        break;
      case OpKind::kCudaFlash:
        std::tie(out, lse, i.cum_seq_q, i.cum_seq_k, i.max_q, i.max_k, i.philox_seed, i.philox_offset,
                 i.debug_attn_mask) =
            at::_ops::_scaled_dot_product_flash_attention::call(q, k, v, i.dropout_p, i.is_causal,
                                                                i.return_debug_mask, i.scale);
        break;
      case OpKind::kCudnn:
        std::tie(out, lse, i.cum_seq_q, i.cum_seq_k, i.max_q, i.max_k, i.philox_seed, i.philox_offset,
                 i.debug_attn_mask) =
            // An undefined Tensor converts to an optional that holds it; cuDNN
            // then rejects it as a 1-D bias: pass nullopt for "no bias".
            at::_ops::_scaled_dot_product_cudnn_attention::call(q, k, v,
                                                                i.attn_bias.defined()
                                                                    ? std::optional<Tensor>(i.attn_bias)
                                                                    : std::nullopt,
                                                                /*compute_log_sumexp=*/true,
                                                                i.dropout_p, i.is_causal, i.return_debug_mask,
                                                                i.scale);
        break;
      case OpKind::kEfficient: {
        const std::optional<Tensor> b = bias.defined() ? std::optional<Tensor>(bias)
                                        : i.attn_bias.defined() ? std::optional<Tensor>(i.attn_bias)
                                                                : std::nullopt;
        std::tie(out, lse, i.philox_seed, i.philox_offset) =
            at::_ops::_scaled_dot_product_efficient_attention::call(q, k, v, b, /*compute_log_sumexp=*/true,
                                                                    i.dropout_p, i.is_causal, i.scale);
        if (bias.defined()) i.attn_bias = bias;
        break;
      }
    }
    ctx->mark_non_differentiable({lse});
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["info"] = c10::IValue::make_capsule(info);
    ctx->saved_data["inputs"] = static_cast<int64_t>(bias.defined() ? 4 : 3);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto info = c10::static_intrusive_pointer_cast<CallInfo>(ctx->saved_data["info"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const Tensor& grad_out = grads[0];
    const bool has_bias = ctx->saved_data["inputs"].toInt() > 3;
    if (!grad_out.defined()) return variable_list(has_bias ? 5 : 4);

    BackwardPlan plan;
    try {
      plan = rt::on_backward(info->plan);
    } catch (const std::exception& e) {
      log_once("plan-error", std::string("backward planning failed, stock backward (logged once): ") + short_what(e));
    }
    std::shared_ptr<CudaTiming> timing;
    if (plan.sample) timing = start_backward_timing(q);
    const auto start = Clock::now();
    // The backend below may throw (stock, as the stock op would): the timing window closes either way.
    // (It is closed explicitly right after the backward, before the audit's copies.)
    struct EndTiming {
      const std::shared_ptr<CudaTiming>& t;
      ~EndTiming() { end_backward_timing(t); }
    } end_timing{timing};
    Backend ran = Backend::kStock;
    std::array<Tensor, 4> g;
    if (plan.backend != Backend::kStock) {
      if (auto r = gaugewatch_backward(*info, plan.backend, grad_out, q, k, v, out, lse)) {
        std::tie(g[0], g[1], g[2]) = *r;
        ran = plan.backend;
      } else {
        rt::count_fallback();
      }
    }
    if (ran == Backend::kStock) g = stock_backward(*info, grad_out, q, k, v, out, lse);
    end_backward_timing(timing);  // before the audit's own copies are launched (idempotent)
    const double backward_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    try {
      rt::record_backward(plan.layer, plan.step, ran);
      if ((plan.sample || plan.capture) && plan.layer >= 0) {
        AuditCall call{grad_out, q, k, v, out, lse, g[0], g[1], g[2], info->is_causal, info->scale,
                       op_name(info->kind), timing};
        audit_call(call, plan, ran, backward_us);
      }
    } catch (const std::exception& e) {
      log_once("record-error", std::string("recording the backward failed (logged once): ") + short_what(e));
    }
    if (has_bias) return {g[0], g[1], g[2], g[3], Tensor()};
    return {g[0], g[1], g[2], Tensor()};
  }
};

struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               c10::intrusive_ptr<CallInfo> info) {
    return AttentionImpl::forward(ctx, q, k, v, Tensor(), info);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return AttentionImpl::backward(ctx, std::move(grads));
  }
};

// The same with a differentiable bias (efficient attention): bias is an input.
struct AttentionBiasFunction : torch::autograd::Function<AttentionBiasFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& bias, c10::intrusive_ptr<CallInfo> info) {
    return AttentionImpl::forward(ctx, q, k, v, bias, info);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return AttentionImpl::backward(ctx, std::move(grads));
  }
};

bool needs_grad(const Tensor& q, const Tensor& k, const Tensor& v) {
  return at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
}

ForwardPlan plan_forward(bool cuda) {
  try {
    return rt::on_forward(in_backward(), cuda);
  } catch (const std::exception& e) {
    log_once("forward-plan", std::string("forward planning failed, layer unknown (logged once): ") + short_what(e));
    ForwardPlan plan;
    return plan;
  }
}

// --- the registered kernels ---------------------------------------------------
std::tuple<Tensor, Tensor> cpu_flash(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                                     bool is_causal, const std::optional<Tensor>& attn_mask,
                                     std::optional<double> scale) {
  const ForwardPlan plan = plan_forward(false);
  if (!needs_grad(q, k, v)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return at::_ops::_scaled_dot_product_flash_attention_for_cpu::call(q, k, v, dropout_p, is_causal, attn_mask,
                                                                       scale);
  }
  auto info = c10::make_intrusive<CallInfo>();
  info->kind = OpKind::kCpuFlash;
  info->dropout_p = dropout_p;
  info->is_causal = is_causal;
  info->scale = scale;
  info->attn_mask = attn_mask;
  info->plan = plan;
  auto outs = AttentionFunction::apply(q, k, v, info);
  return {outs[0], outs[1]};
}

using FlashOut = std::tuple<Tensor, Tensor, Tensor, Tensor, c10::SymInt, c10::SymInt, Tensor, Tensor, Tensor>;

FlashOut cuda_flash(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p, bool is_causal,
                    bool return_debug_mask, std::optional<double> scale) {
  const ForwardPlan plan = plan_forward(true);
  if (!needs_grad(q, k, v)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return at::_ops::_scaled_dot_product_flash_attention::call(q, k, v, dropout_p, is_causal, return_debug_mask,
                                                               scale);
  }
  auto info = c10::make_intrusive<CallInfo>();
  info->kind = OpKind::kCudaFlash;
  info->dropout_p = dropout_p;
  info->is_causal = is_causal;
  info->return_debug_mask = return_debug_mask;
  info->scale = scale;
  info->plan = plan;
  auto outs = AttentionFunction::apply(q, k, v, info);
  const CallInfo& i = *info;
  return {outs[0], outs[1], i.cum_seq_q, i.cum_seq_k, i.max_q, i.max_k, i.philox_seed, i.philox_offset,
          i.debug_attn_mask};
}

FlashOut cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& attn_bias,
               bool compute_log_sumexp, double dropout_p, bool is_causal, bool return_debug_mask,
               std::optional<double> scale) {
  const ForwardPlan plan = plan_forward(true);
  if (!needs_grad(q, k, v)) {
    at::AutoDispatchBelowADInplaceOrView below;
    return at::_ops::_scaled_dot_product_cudnn_attention::call(q, k, v, attn_bias, compute_log_sumexp, dropout_p,
                                                               is_causal, return_debug_mask, scale);
  }
  auto info = c10::make_intrusive<CallInfo>();
  info->kind = OpKind::kCudnn;
  info->dropout_p = dropout_p;
  info->is_causal = is_causal;
  info->return_debug_mask = return_debug_mask;
  info->scale = scale;
  // cuDNN's backward gives no bias gradient: the bias is a constant here, as in derivatives.yaml.
  if (attn_bias.has_value()) info->attn_bias = attn_bias->detach();
  info->plan = plan;
  auto outs = AttentionFunction::apply(q, k, v, info);
  const CallInfo& i = *info;
  return {outs[0], outs[1], i.cum_seq_q, i.cum_seq_k, i.max_q, i.max_k, i.philox_seed, i.philox_offset,
          i.debug_attn_mask};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> efficient(const Tensor& q, const Tensor& k, const Tensor& v,
                                                     const std::optional<Tensor>& attn_bias,
                                                     bool compute_log_sumexp, double dropout_p, bool is_causal,
                                                     std::optional<double> scale) {
  const bool bias_grad = attn_bias.has_value() && attn_bias->defined() && attn_bias->requires_grad();
  const ForwardPlan plan = plan_forward(true);
  if (!needs_grad(q, k, v) && !(bias_grad && at::GradMode::is_enabled())) {
    at::AutoDispatchBelowADInplaceOrView below;
    return at::_ops::_scaled_dot_product_efficient_attention::call(q, k, v, attn_bias, compute_log_sumexp,
                                                                   dropout_p, is_causal, scale);
  }
  auto info = c10::make_intrusive<CallInfo>();
  info->kind = OpKind::kEfficient;
  info->dropout_p = dropout_p;
  info->is_causal = is_causal;
  info->scale = scale;
  info->grad_mask = {q.requires_grad(), k.requires_grad(), v.requires_grad(), bias_grad};
  if (attn_bias.has_value() && attn_bias->defined() && !bias_grad) info->attn_bias = *attn_bias;
  info->plan = plan;
  auto outs = bias_grad ? AttentionBiasFunction::apply(q, k, v, *attn_bias, info)
                        : AttentionFunction::apply(q, k, v, info);
  const CallInfo& i = *info;
  return {outs[0], outs[1], i.philox_seed, i.philox_offset};
}

// --- versions for the agent's Hello ----------------------------------------------
// CUDA builds: the CUDA runtime's version and the CUDA version the installed
// driver supports ("13.0"), when a driver is there; "" without one (a CPU
// machine) and in CPU-only builds. Neither call creates a CUDA context or
// initializes the driver (safe before a fork).
int cuda_driver_number() {
#if defined(GAUGEWATCH_HOOKS_CUDA)
  int version = 0;
  if (cudaDriverGetVersion(&version) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return version;
#else
  return 0;
#endif
}

std::string cuda_driver_version() { return format_cuda_version(cuda_driver_number()); }

std::string cuda_runtime_version() {
#if defined(GAUGEWATCH_HOOKS_CUDA)
  if (cuda_driver_number() <= 0) return "";
  int version = 0;
  if (cudaRuntimeGetVersion(&version) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return format_cuda_version(version);
#else
  return "";
#endif
}

// --- ops for the Python helper ---------------------------------------------------
std::string stats_op() { return stats_json(); }
std::vector<std::string> layer_names_op() { return layer_names(); }
void begin_pass_op() { begin_pass(); }
void enter_layer_op(c10::string_view name) { enter_layer(name); }
void exit_layer_op(c10::string_view name) { exit_layer(name); }
bool flush_op(double timeout_s) { return flush(timeout_s); }
void optimizer_step_op() { end_step(); }
void use_optimizer_steps_op() { use_optimizer_steps(); }
bool active_op() { return true; }

struct Registration {
  std::unique_ptr<torch::Library> defs, cpu, cuda;

  Registration() {
    try {
      if (c10::Dispatcher::singleton().findSchema({"gaugewatch_hooks::stats", ""}).has_value()) {
        log_line("another copy of libgaugewatch_hooks is already loaded in this process: this copy stays inert");
        return;
      }
      if (rt::config().disabled) {
        log_line("GAUGEWATCH_DISABLE is set: SDPA is not intercepted");
        return;
      }
      rt::set_versions(TORCH_VERSION, cuda_runtime_version(), cuda_driver_version());
      defs = std::make_unique<torch::Library>(torch::Library::DEF, "gaugewatch_hooks", std::nullopt, __FILE__,
                                              __LINE__);
      defs->def("stats() -> str", &stats_op);
      defs->def("layer_names() -> str[]", &layer_names_op);
      defs->def("begin_pass() -> ()", &begin_pass_op);
      defs->def("enter_layer(str name) -> ()", &enter_layer_op);
      defs->def("exit_layer(str name) -> ()", &exit_layer_op);
      defs->def("flush(float timeout_s=5.0) -> bool", &flush_op);
      defs->def("active() -> bool", &active_op);
      defs->def("optimizer_step() -> ()", &optimizer_step_op);
      defs->def("use_optimizer_steps() -> ()", &use_optimizer_steps_op);
      cpu = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradCPU, __FILE__,
                                             __LINE__);
      cpu->impl("_scaled_dot_product_flash_attention_for_cpu", TORCH_FN(cpu_flash));
      cuda = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradCUDA,
                                              __FILE__, __LINE__);
      cuda->impl("_scaled_dot_product_flash_attention", TORCH_FN(cuda_flash));
      cuda->impl("_scaled_dot_product_cudnn_attention", TORCH_FN(cudnn));
      cuda->impl("_scaled_dot_product_efficient_attention", TORCH_FN(efficient));
    } catch (const std::exception& e) {
      log_line(std::string("registration failed, SDPA is not intercepted: ") + short_what(e));
      cuda.reset();
      cpu.reset();
      defs.reset();
    }
  }
};

// Leaked on purpose: the kernels must stay registered until the process ends.
const Registration* const g_registration = new Registration;

}  // namespace
}  // namespace gaugewatch::hooks
