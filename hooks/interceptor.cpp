// The interceptor: kernels registered at the AutogradCPU / AutogradCUDA keys
// for SDPA's fused attention ops (sdpa_ops.h lists them). Each one calls the
// stock forward below autograd, wraps it in a torch::autograd::Function whose
// backward runs the layer's backend (the runtime, runtime.h, decides which),
// and hands sampled calls to the auditor (auditor.h). The backward of backend
// "stock" is the op's own backward; other backends call
// gaugewatch::attention_backward (gaugewatch_backends.h), and any failure
// there logs once and runs stock instead. Nothing here throws into the
// trainer beyond what the stock ops themselves would throw.
// While PyTorch traces (torch.compile), the kernels run none of this: they
// put the call into the graph as gaugewatch::monitored_attention, whose
// kernels do it at every call (compile_ops.h).
//
// Registration happens when the library is loaded (LD_PRELOAD,
// torch.ops.load_library, or linking). A second copy of the library finds the
// first one's gaugewatch_hooks ops, logs once and registers nothing.
// GAUGEWATCH_DISABLE=1, or an unwritable stats / log file, registers nothing
// either.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>
#include <torch/version.h>

#include <array>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

#include "hooks/auditor.h"
#include "hooks/backward_timing.h"
#include "hooks/call_coverage.h"
#include "hooks/compile_ops.h"
#include "hooks/cuda_versions.h"
#include "hooks/gaugewatch_backends.h"
#include "hooks/interception.h"
#include "hooks/log.h"
#include "hooks/math_path.h"
#include "hooks/python_ops.h"
#include "hooks/runtime.h"
#include "hooks/sdpa_ops.h"
#include "hooks/torch_errors.h"

namespace gaugewatch::hooks {
namespace {

using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Clock = std::chrono::steady_clock;

bool in_backward() { return torch::autograd::get_current_graph_task_id() != -1; }

}  // namespace

std::array<Tensor, 4> intercepted_backward(const CallInfo& info, const Tensor& grad_out, const Tensor& q,
                                           const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  BackwardPlan plan;
  try {
    plan = runtime().on_backward(info.plan);
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
    if (auto r = gaugewatch_backward(info, plan.backend, grad_out, q, k, v, out, lse)) {
      g = *r;
      ran = plan.backend;
    } else {
      runtime().count_fallback();
    }
  }
  if (ran == Backend::kStock) g = stock_backward(info, grad_out, q, k, v, out, lse);
  end_backward_timing(timing);  // before the audit's own copies are launched (idempotent)
  const double backward_us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  try {
    runtime().record_backward(plan.layer, plan.step, ran);
    if ((plan.sample || plan.capture) && plan.layer >= 0) {
      AuditCall call{grad_out, q, k, v, out, lse, g[0], g[1], g[2], info.is_causal, info.scale,
                     op_name(info.kind), timing, info.mask(), info.dropout_p};
      audit_call(call, plan, ran, backward_us);
    }
  } catch (const std::exception& e) {
    log_once("record-error", std::string("recording the backward failed (logged once): ") + short_what(e));
  }
  return g;
}

namespace {

// --- the autograd Function ----------------------------------------------------
// Inputs: {q, k, v} or {q, k, v, bias} (a differentiable efficient-attention
// bias; undefined tensors cannot be Function inputs), info. Outputs: out, lse
// (lse non-differentiable).
struct AttentionImpl {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& bias, const c10::intrusive_ptr<CallInfo>& info) {
    auto [out, lse] = stock_forward(*info, q, k, v, bias);
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

    const std::array<Tensor, 4> g = intercepted_backward(*info, grad_out, q, k, v, out, lse);
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

}  // namespace

c10::intrusive_ptr<CallInfo> new_call(OpKind kind, double dropout_p, bool is_causal, std::optional<double> scale,
                                      bool cuda) {
  auto info = c10::make_intrusive<CallInfo>();
  info->kind = kind;
  info->dropout_p = dropout_p;
  info->is_causal = is_causal;
  info->scale = scale;
  try {
    if (cuda) {
      static std::once_flag identified;
      std::call_once(identified, [] {
        GpuIdentity id = current_gpu_identity();
        runtime().set_gpu_identity(std::move(id.uuid), std::move(id.pci_bus_id));
      });
    }
    info->plan = runtime().on_forward(in_backward(), cuda);
  } catch (const std::exception& e) {
    log_once("forward-plan", std::string("forward planning failed, layer unknown (logged once): ") + short_what(e));
  }
  return info;
}

void count_training_call(const CallInfo& info, const Tensor& q, const Tensor& k) {
  if (info.plan.recompute) return;
  try {
    runtime().count_call(info.plan.layer, classify(info, q, k));
  } catch (const std::exception& e) {
    log_once("count-call", std::string("counting an attention call failed (logged once): ") + short_what(e));
  }
}

namespace {

// The stock forward: through the autograd Function when a gradient is
// needed, else directly (below autograd).
std::tuple<Tensor, Tensor> run(const c10::intrusive_ptr<CallInfo>& info, const Tensor& q, const Tensor& k,
                               const Tensor& v, bool grad) {
  if (!grad) return stock_forward(*info, q, k, v, Tensor());
  count_training_call(*info, q, k);
  auto outs = AttentionFunction::apply(q, k, v, info);
  return {outs[0], outs[1]};
}

// --- the registered kernels (the stock ops' schemas) --------------------------
std::tuple<Tensor, Tensor> cpu_flash(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p,
                                     bool is_causal, const std::optional<Tensor>& attn_mask,
                                     std::optional<double> scale) {
  if (tracing()) {
    return traced_attention(OpKind::kCpuFlash, q, k, v, attn_mask, dropout_p, is_causal, scale, needs_grad(q, k, v),
                            false);
  }
  auto info = new_call(OpKind::kCpuFlash, dropout_p, is_causal, scale, false);
  info->attn_mask = attn_mask;
  return run(info, q, k, v, needs_grad(q, k, v));
}

using FlashOut = std::tuple<Tensor, Tensor, Tensor, Tensor, c10::SymInt, c10::SymInt, Tensor, Tensor, Tensor>;

FlashOut flash_out(const CallInfo& i, const std::tuple<Tensor, Tensor>& outs) {
  return {std::get<0>(outs), std::get<1>(outs), i.cum_seq_q,     i.cum_seq_k,      i.max_q,
          i.max_k,           i.philox_seed,     i.philox_offset, i.debug_attn_mask};
}

// While tracing: the compiled graph's call (compile_ops.h); the extra outputs
// stay inside the custom ops.
FlashOut traced_flash_out(const std::tuple<Tensor, Tensor>& outs, const Tensor& q, const Tensor& k) {
  return {std::get<0>(outs), std::get<1>(outs), Tensor(), Tensor(), q.sym_size(2), k.sym_size(2),
          Tensor(),          Tensor(),          Tensor()};
}

FlashOut cuda_flash(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p, bool is_causal,
                    bool return_debug_mask, std::optional<double> scale) {
  if (tracing()) {
    return traced_flash_out(traced_attention(OpKind::kCudaFlash, q, k, v, std::nullopt, dropout_p, is_causal, scale,
                                             needs_grad(q, k, v), false),
                            q, k);
  }
  auto info = new_call(OpKind::kCudaFlash, dropout_p, is_causal, scale, true);
  info->return_debug_mask = return_debug_mask;
  return flash_out(*info, run(info, q, k, v, needs_grad(q, k, v)));
}

FlashOut cudnn(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& attn_bias,
               bool /*compute_log_sumexp*/, double dropout_p, bool is_causal, bool return_debug_mask,
               std::optional<double> scale) {
  if (tracing()) {
    const std::optional<Tensor> bias =
        attn_bias.has_value() && attn_bias->defined() ? std::optional<Tensor>(attn_bias->detach()) : std::nullopt;
    return traced_flash_out(
        traced_attention(OpKind::kCudnn, q, k, v, bias, dropout_p, is_causal, scale, needs_grad(q, k, v), false), q,
        k);
  }
  auto info = new_call(OpKind::kCudnn, dropout_p, is_causal, scale, true);
  info->return_debug_mask = return_debug_mask;
  // cuDNN's backward gives no bias gradient: the bias is a constant here, as in derivatives.yaml.
  if (attn_bias.has_value()) info->attn_bias = attn_bias->detach();
  return flash_out(*info, run(info, q, k, v, needs_grad(q, k, v)));
}

std::tuple<Tensor, Tensor, Tensor, Tensor> efficient(const Tensor& q, const Tensor& k, const Tensor& v,
                                                     const std::optional<Tensor>& attn_bias,
                                                     bool /*compute_log_sumexp*/, double dropout_p, bool is_causal,
                                                     std::optional<double> scale) {
  const bool has_bias = attn_bias.has_value() && attn_bias->defined();
  const bool bias_grad = has_bias && attn_bias->requires_grad() && at::GradMode::is_enabled();
  if (tracing()) {
    auto [out, lse] = traced_attention(OpKind::kEfficient, q, k, v, attn_bias, dropout_p, is_causal, scale,
                                       needs_grad(q, k, v) || bias_grad, bias_grad);
    return {out, lse, Tensor(), Tensor()};
  }
  auto info = new_call(OpKind::kEfficient, dropout_p, is_causal, scale, true);
  info->grad_mask = {q.requires_grad(), k.requires_grad(), v.requires_grad(), bias_grad};
  std::tuple<Tensor, Tensor> outs;
  if (bias_grad) {
    info->attn_bias = *attn_bias;  // for the coverage's verdict; the Function sets it again from its input
    count_training_call(*info, q, k);
    auto o = AttentionBiasFunction::apply(q, k, v, *attn_bias, info);
    outs = {o[0], o[1]};
  } else {
    if (has_bias) info->attn_bias = *attn_bias;
    outs = run(info, q, k, v, needs_grad(q, k, v));
  }
  return {std::get<0>(outs), std::get<1>(outs), info->philox_seed, info->philox_offset};
}

struct Registration {
  std::unique_ptr<torch::Library> defs, compile_defs, cpu, cuda;

  Registration() {
    try {
      if (python_ops_registered()) {
        log_line("another copy of libgaugewatch_hooks is already loaded in this process: this copy stays inert");
        return;
      }
      if (runtime().config().disabled) {
        log_line("the hooks are disabled (GAUGEWATCH_DISABLE, or an error above): SDPA is not intercepted");
        return;
      }
      runtime().set_versions(TORCH_VERSION, cuda_runtime_version(), cuda_driver_version());
      defs = std::make_unique<torch::Library>(torch::Library::DEF, "gaugewatch_hooks", std::nullopt, __FILE__,
                                              __LINE__);
      define_python_ops(*defs);
      compile_defs = std::make_unique<torch::Library>(torch::Library::FRAGMENT, "gaugewatch", std::nullopt, __FILE__,
                                                      __LINE__);
      register_compile_ops(*compile_defs);
      cpu = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradCPU, __FILE__,
                                             __LINE__);
      cpu->impl("_scaled_dot_product_flash_attention_for_cpu", TORCH_FN(cpu_flash));
      cuda = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradCUDA,
                                              __FILE__, __LINE__);
      cuda->impl("_scaled_dot_product_flash_attention", TORCH_FN(cuda_flash));
      cuda->impl("_scaled_dot_product_cudnn_attention", TORCH_FN(cudnn));
      cuda->impl("_scaled_dot_product_efficient_attention", TORCH_FN(efficient));
      register_math_path(*cpu, *cuda);
    } catch (const std::exception& e) {
      log_line(std::string("registration failed, SDPA is not intercepted: ") + short_what(e));
      cuda.reset();
      cpu.reset();
      compile_defs.reset();
      defs.reset();
    }
  }
};

// Leaked on purpose: the kernels must stay registered until the process ends.
const Registration* const g_registration = new Registration;

}  // namespace
}  // namespace gaugewatch::hooks
