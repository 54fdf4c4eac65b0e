// torch.compile support (compile_ops.h): gaugewatch::monitored_attention and
// gaugewatch::monitored_attention_backward, their kernels, and the traced
// autograd Function that puts them into a compiled graph.
//
// A forward's CallInfo (its plan, and the stock forward's extra outputs such
// as the dropout RNG state) reaches its backward through a table keyed by
// the storage of the log-sum-exp the forward returned: the compiled graph
// saves that tensor for the backward and hands it to the backward op
// unchanged. An entry is removed when its backward runs; a forward whose
// backward never runs leaves an entry that the next allocation at the same
// address replaces, or that is dropped once it is two steps old.
//
// Output layouts: the Meta kernels and the runtime kernels take every
// output's strides from the same rules (below), which follow the stock ops
// (torch 2.11): a stock result in another layout is copied into it, so the
// compiled graph's stride assertions always hold.

#include "hooks/compile_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#if defined(GAUGEWATCH_HOOKS_CUDA)
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "hooks/gaugewatch_hooks.h"
#include "hooks/interception.h"
#include "hooks/log.h"
#include "hooks/torch_errors.h"
#include "kernels/torch/stride_order.h"

namespace gaugewatch::hooks {
namespace {

using at::Tensor;
using c10::SymInt;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// --- op names ------------------------------------------------------------------
const char* kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kCpuFlash: return "cpu_flash";
    case OpKind::kCudaFlash: return "flash";
    case OpKind::kCudnn: return "cudnn";
    case OpKind::kEfficient: return "efficient";
  }
  return "?";
}

OpKind parse_kind(c10::string_view name) {
  for (OpKind kind : {OpKind::kCpuFlash, OpKind::kCudaFlash, OpKind::kCudnn, OpKind::kEfficient}) {
    if (name == kind_name(kind)) return kind;
  }
  TORCH_CHECK(false, "gaugewatch::monitored_attention: unknown op '", std::string(name),
              "' (cpu_flash, flash, cudnn, efficient)");
}

// --- layouts -------------------------------------------------------------------
using Sizes = std::vector<SymInt>;

// Dense strides for `sizes` laid out in `order` (outermost dimension first).
Sizes strides_in_order(const Sizes& sizes, const std::vector<std::int64_t>& order) {
  Sizes strides(sizes.size(), SymInt(1));
  SymInt running(1);
  for (auto i = order.size(); i > 0; --i) {
    const auto dim = static_cast<std::size_t>(order[i - 1]);
    strides[dim] = running;
    running = running * sizes[dim];
  }
  return strides;
}

const std::vector<std::int64_t> kBnhd{0, 2, 1, 3};  // (B, N, H, d) in memory, viewed as (B, H, N, d)

struct Layout {
  Sizes sizes, strides;
};

// The attention output (B, H, N, Dv): efficient attention always allocates
// (B, N, H, Dv); the CPU and CUDA flash and cuDNN ops follow the query's
// stride order (torch_ops::stride_order; measured on the CPU flash op for
// contiguous, transposed and fused-qkv queries; the CUDA ops by reading
// their allocation).
Layout out_layout(OpKind kind, const Tensor& q, const Tensor& v) {
  Sizes sizes{q.sym_size(0), q.sym_size(1), q.sym_size(2), v.sym_size(3)};
  const auto order = kind == OpKind::kEfficient ? kBnhd : torch_ops::stride_order(q);
  auto strides = strides_in_order(sizes, order);
  return {std::move(sizes), std::move(strides)};
}

// The log-sum-exp as each op returns it (torch/_meta_registrations.py):
// CPU flash (B, H, N) over (B, N, H) memory; CUDA flash (B, H, N); cuDNN
// (B, H, N, 1); efficient attention (B, H, 32 ceil(N / 32)), padded.
Layout lse_layout(OpKind kind, const Tensor& q) {
  const SymInt b = q.sym_size(0), h = q.sym_size(1), n = q.sym_size(2);
  switch (kind) {
    case OpKind::kCpuFlash: {
      Sizes sizes{b, h, n};
      auto strides = strides_in_order(sizes, {0, 2, 1});
      return {std::move(sizes), std::move(strides)};
    }
    case OpKind::kCudaFlash: {
      Sizes sizes{b, h, n};
      auto strides = strides_in_order(sizes, {0, 1, 2});
      return {std::move(sizes), std::move(strides)};
    }
    case OpKind::kCudnn: {
      Sizes sizes{b, h, n, SymInt(1)};
      auto strides = strides_in_order(sizes, {0, 1, 2, 3});
      return {std::move(sizes), std::move(strides)};
    }
    case OpKind::kEfficient: {
      Sizes sizes{b, h, ((n + 31) / 32) * 32};
      auto strides = strides_in_order(sizes, {0, 1, 2});
      return {std::move(sizes), std::move(strides)};
    }
  }
  return {};
}

// A gradient of `input` as the stock backward returns it (stock_grad_order,
// sdpa_ops.h; the gaugewatch backends return the same: stock_grad_layout).
Layout grad_layout(OpKind kind, const Tensor& input) {
  Sizes sizes(input.sym_sizes().begin(), input.sym_sizes().end());
  auto strides = strides_in_order(sizes, stock_grad_order(input, kind));
  return {std::move(sizes), std::move(strides)};
}

Tensor empty_in(const Layout& layout, const at::TensorOptions& options) {
  return at::empty_strided_symint(layout.sizes, layout.strides, options);
}

// `t` in `layout` (a copy only when its strides differ).
Tensor conform(const Tensor& t, const Layout& layout) {
  if (!t.defined()) return t;
  if (t.sym_sizes().equals(layout.sizes) && t.sym_strides().equals(layout.strides)) return t;
  TORCH_CHECK(t.sym_sizes().equals(layout.sizes), "gaugewatch::monitored_attention: result of shape ",
              t.sym_sizes(), " where ", c10::SymIntArrayRef(layout.sizes), " was expected");
  Tensor target = empty_in(layout, t.options());
  target.copy_(t);
  return target;
}

// --- CUDA graph capture ----------------------------------------------------------
// A call made while a CUDA graph is being captured runs, at every replay,
// only the kernels captured now: none of the runtime. Inductor keeps these
// ops out of its CUDA graphs (cudagraph_unsafe, graph partitioning); a graph
// captured by hand (torch.cuda.graph) around a model takes them in. Such a
// call runs the stock op without the runtime, logged once (reason
// "cudagraphs"). A failing query counts as "not capturing" (never thrown).
bool capturing(const Tensor& t) {
#if defined(GAUGEWATCH_HOOKS_CUDA)
  if (!t.is_cuda()) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(t.device().index()).stream(), &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
#else
  (void)t;
  return false;
#endif
}

void log_captured(const char* what) {
  log_once("compile-cudagraphs",
           std::string("an attention ") + what +
               " is being captured into a CUDA graph: its replays run the stock kernels without the runtime, "
               "unmonitored and without backend switches (reason \"cudagraphs\"; logged once). With "
               "torch.compile(mode=\"reduce-overhead\") Inductor keeps the attention ops out of its CUDA graphs "
               "unless graph partitioning is off (torch._inductor.config.graph_partition)");
}

// --- forward -> backward: the call's info, keyed by its log-sum-exp's storage --------
class CallTable {
 public:
  void put(const Tensor& lse, c10::intrusive_ptr<CallInfo> info) {
    std::lock_guard lock(mu_);
    newest_step_ = std::max(newest_step_, info->plan.step);
    if (table_.size() >= kSoftLimit) drop_stale_locked();
    table_.insert_or_assign(lse.data_ptr(), std::move(info));
  }

  c10::intrusive_ptr<CallInfo> take(const Tensor& lse) {
    std::lock_guard lock(mu_);
    auto it = table_.find(lse.data_ptr());
    if (it == table_.end()) return {};
    auto info = std::move(it->second);
    table_.erase(it);
    return info;
  }

 private:
  // Records of forwards from steps before the last two never get their
  // backward (a step's backwards run within it): dropped, with the masks they hold.
  void drop_stale_locked() {
    const auto before = table_.size();
    for (auto it = table_.begin(); it != table_.end();) {
      it = it->second->plan.step + 2 < newest_step_ ? table_.erase(it) : std::next(it);
    }
    if (table_.size() >= kSoftLimit) {
      log_once("compile-table", std::to_string(table_.size()) +
                                    " compiled attention forwards of the last two steps wait for their backward "
                                    "(logged once)");
    } else if (before != table_.size()) {
      log_once("compile-table-stale", std::to_string(before - table_.size()) +
                                          " compiled attention forwards never ran their backward: their records "
                                          "are dropped (logged once)");
    }
  }

  static constexpr std::size_t kSoftLimit = 1 << 14;
  std::mutex mu_;
  std::uint64_t newest_step_ = 0;
  std::unordered_map<const void*, c10::intrusive_ptr<CallInfo>> table_;
};

CallTable& call_table() {
  static auto* table = new CallTable;  // leaked: kernels may run during exit
  return *table;
}

void set_mask(CallInfo& info, const std::optional<Tensor>& mask) {
  if (!mask.has_value() || !mask->defined()) return;
  if (info.kind == OpKind::kCpuFlash) {
    info.attn_mask = mask;
  } else {
    info.attn_bias = *mask;
  }
}

// --- the runtime kernels ------------------------------------------------------------
// A call's info without the runtime (a call being captured into a CUDA
// graph, or a backward whose forward left no record).
c10::intrusive_ptr<CallInfo> bare_call(OpKind kind, const Tensor& q, const Tensor& k, double dropout_p,
                                       bool is_causal, std::optional<double> scale) {
  auto info = c10::make_intrusive<CallInfo>();
  info->kind = kind;
  info->dropout_p = dropout_p;
  info->is_causal = is_causal;
  info->scale = scale;
  info->max_q = q.sym_size(2);
  info->max_k = k.sym_size(2);
  return info;
}

std::tuple<Tensor, Tensor> monitored_attention(c10::string_view op, const Tensor& q, const Tensor& k,
                                               const Tensor& v, const std::optional<Tensor>& mask, double dropout_p,
                                               bool is_causal, std::optional<double> scale, bool backward,
                                               bool bias_grad, c10::string_view layer) {
  const OpKind kind = parse_kind(op);
  c10::intrusive_ptr<CallInfo> info;
  const bool captured = capturing(q);
  if (captured) {
    log_captured("forward");
    info = bare_call(kind, q, k, dropout_p, is_causal, scale);
  } else if (!layer.empty()) {
    // Named at compile time (the helper's graph pass, compile.py): the name
    // the module hooks give the call in eager mode.
    const LayerScope scope{std::string(layer)};
    info = new_call(kind, dropout_p, is_causal, scale, q.is_cuda());
  } else {
    info = new_call(kind, dropout_p, is_causal, scale, q.is_cuda());
  }
  set_mask(*info, mask);
  info->grad_mask = {true, true, true, bias_grad};
  if (backward && captured) {
    // Seen once, at its capture; its replays run the stock kernels unseen.
    runtime().count_call(-1, CallVerdict{false, "cudagraphs", {}});
  } else if (backward) {
    count_training_call(*info, q, k);
  }
  auto [out, lse] = stock_forward(*info, q, k, v, Tensor());
  out = conform(out, out_layout(kind, q, v));
  lse = conform(lse, lse_layout(kind, q));
  if (backward) call_table().put(lse, info);
  return {out, lse};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> monitored_attention_backward(
    c10::string_view op, const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
    const std::optional<Tensor>& mask, const Tensor& out, const Tensor& lse, double dropout_p, bool is_causal,
    std::optional<double> scale, bool bias_grad) {
  const OpKind kind = parse_kind(op);
  auto info = call_table().take(lse);
  const bool captured = capturing(q);
  if (!info) {
    // No record of the forward (dropped as stale): the runtime treats the call
    // as a recomputed one (the highest layer still waiting for its backward).
    TORCH_CHECK(dropout_p == 0.0, "gaugewatch::monitored_attention_backward: the forward's record (its dropout ",
                "RNG state) is missing: the backward cannot rerun its dropout");
    log_once("compile-no-record",
             "a compiled attention backward found no record of its forward: run as a recomputed call (logged once)");
    info = bare_call(kind, q, k, dropout_p, is_causal, scale);
    info->plan.recompute = true;
    set_mask(*info, mask);
    info->grad_mask = {true, true, true, bias_grad};
  }
  std::array<Tensor, 4> g;
  if (captured) {
    log_captured("backward");
    g = stock_backward(*info, grad_out, q, k, v, out, lse);
  } else {
    g = intercepted_backward(*info, grad_out, q, k, v, out, lse);
  }
  Tensor dbias = bias_grad && g[3].defined() ? g[3].contiguous() : at::empty({0}, q.options());
  return {conform(g[0], grad_layout(kind, q)), conform(g[1], grad_layout(kind, k)),
          conform(g[2], grad_layout(kind, v)), dbias};
}

// --- the Meta kernels -----------------------------------------------------------------
std::tuple<Tensor, Tensor> monitored_attention_meta(c10::string_view op, const Tensor& q, const Tensor& /*k*/,
                                                    const Tensor& v, const std::optional<Tensor>& /*mask*/,
                                                    double /*dropout_p*/, bool /*is_causal*/,
                                                    std::optional<double> /*scale*/, bool /*backward*/,
                                                    bool /*bias_grad*/, c10::string_view /*layer*/) {
  const OpKind kind = parse_kind(op);
  return {empty_in(out_layout(kind, q, v), q.options()),
          empty_in(lse_layout(kind, q), q.options().dtype(at::kFloat))};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> monitored_attention_backward_meta(
    c10::string_view op, const Tensor& /*grad_out*/, const Tensor& q, const Tensor& k, const Tensor& v,
    const std::optional<Tensor>& mask, const Tensor& /*out*/, const Tensor& /*lse*/, double /*dropout_p*/,
    bool /*is_causal*/, std::optional<double> /*scale*/, bool bias_grad) {
  const OpKind kind = parse_kind(op);
  Tensor dbias = at::empty({0}, q.options());
  if (bias_grad && mask.has_value() && mask->defined()) {
    dbias = at::empty_symint(mask->sym_sizes(), mask->options());
  }
  return {empty_in(grad_layout(kind, q), q.options()), empty_in(grad_layout(kind, k), k.options()),
          empty_in(grad_layout(kind, v), v.options()), dbias};
}

// --- the traced autograd Function ---------------------------------------------------
struct TracedCall : torch::CustomClassHolder {
  OpKind kind = OpKind::kCpuFlash;
  std::optional<Tensor> mask;  // a constant mask or bias (none when the bias is a Function input)
  double dropout_p = 0.0;
  bool is_causal = false;
  std::optional<double> scale;
  bool bias_grad = false;
};

using ForwardFn = std::tuple<Tensor, Tensor>(c10::string_view, const Tensor&, const Tensor&, const Tensor&,
                                             const std::optional<Tensor>&, double, bool, std::optional<double>, bool,
                                             bool, c10::string_view);
using BackwardFn = std::tuple<Tensor, Tensor, Tensor, Tensor>(c10::string_view, const Tensor&, const Tensor&,
                                                              const Tensor&, const Tensor&,
                                                              const std::optional<Tensor>&, const Tensor&,
                                                              const Tensor&, double, bool, std::optional<double>,
                                                              bool);

c10::TypedOperatorHandle<ForwardFn> forward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("gaugewatch::monitored_attention", "")
                             .typed<ForwardFn>();
  return op;
}

c10::TypedOperatorHandle<BackwardFn> backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("gaugewatch::monitored_attention_backward", "")
                             .typed<BackwardFn>();
  return op;
}

struct TracedImpl {
  // bias: a differentiable bias (efficient attention), else undefined (undefined
  // tensors cannot be Function inputs: the TracedFunction below has none).
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& bias, const c10::intrusive_ptr<TracedCall>& call) {
    const std::optional<Tensor> mask = bias.defined() ? std::optional<Tensor>(bias) : call->mask;
    auto [out, lse] = forward_op().call(kind_name(call->kind), q, k, v, mask, call->dropout_p, call->is_causal,
                                        call->scale, /*backward=*/true, call->bias_grad, "");
    ctx->mark_non_differentiable({lse});
    if (bias.defined()) {
      ctx->save_for_backward({q, k, v, out, lse, bias});
    } else {
      ctx->save_for_backward({q, k, v, out, lse});
    }
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads, bool with_bias) {
    auto call = c10::static_intrusive_pointer_cast<TracedCall>(ctx->saved_data["call"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    if (!grads[0].defined()) return variable_list(with_bias ? 5 : 4);
    const std::optional<Tensor> mask = saved.size() > 5 ? std::optional<Tensor>(saved[5]) : call->mask;
    auto [dq, dk, dv, dbias] =
        backward_op().call(kind_name(call->kind), grads[0], q, k, v, mask, out, lse, call->dropout_p,
                           call->is_causal, call->scale, call->bias_grad);
    if (with_bias) return {dq, dk, dv, dbias, Tensor()};
    return {dq, dk, dv, Tensor()};
  }
};

struct TracedFunction : torch::autograd::Function<TracedFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               c10::intrusive_ptr<TracedCall> call) {
    return TracedImpl::forward(ctx, q, k, v, Tensor(), call);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return TracedImpl::backward(ctx, std::move(grads), false);
  }
};

struct TracedBiasFunction : torch::autograd::Function<TracedBiasFunction> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const Tensor& bias, c10::intrusive_ptr<TracedCall> call) {
    return TracedImpl::forward(ctx, q, k, v, bias, call);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return TracedImpl::backward(ctx, std::move(grads), true);
  }
};

}  // namespace

bool tracing() {
  using c10::impl::TorchDispatchModeKey;
  using c10::impl::TorchDispatchModeTLS;
  return TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FUNCTIONAL).has_value();
}

std::tuple<Tensor, Tensor> traced_attention(OpKind kind, const Tensor& q, const Tensor& k, const Tensor& v,
                                            const std::optional<Tensor>& mask, double dropout_p, bool is_causal,
                                            std::optional<double> scale, bool grad, bool bias_grad) {
  if (!grad) {
    at::AutoDispatchBelowADInplaceOrView below;
    return forward_op().call(kind_name(kind), q, k, v, mask, dropout_p, is_causal, scale, /*backward=*/false,
                             false, "");
  }
  auto call = c10::make_intrusive<TracedCall>();
  call->kind = kind;
  call->dropout_p = dropout_p;
  call->is_causal = is_causal;
  call->scale = scale;
  call->bias_grad = bias_grad;
  if (bias_grad) {
    auto outs = TracedBiasFunction::apply(q, k, v, *mask, call);
    return {outs[0], outs[1]};
  }
  if (mask.has_value() && mask->defined()) call->mask = mask->detach();
  auto outs = TracedFunction::apply(q, k, v, call);
  return {outs[0], outs[1]};
}

void register_compile_ops(torch::Library& defs) {
  // cudagraph_unsafe: Inductor partitions its CUDA graphs around these ops
  // (reduce-overhead), so their kernels, and the runtime, run at every call.
  const std::vector<at::Tag> tags{at::Tag::cudagraph_unsafe};
  // op: the intercepted stock op (cpu_flash, flash, cudnn, efficient);
  // attn_mask: its mask (CPU flash) or bias (cuDNN, efficient); backward:
  // the call's backward will run (the runtime keeps its record until then);
  // bias_grad: efficient attention's bias needs a gradient; layer: the
  // layer's name when the compiled graph knows it (the Python helper's graph
  // pass sets it from the module that makes the call), else "" (the runtime
  // names the call as in eager mode).
  defs.def(
      "monitored_attention(str op, Tensor query, Tensor key, Tensor value, Tensor? attn_mask, float dropout_p, "
      "bool is_causal, float? scale, bool backward, bool bias_grad, str layer=\"\") -> (Tensor out, "
      "Tensor logsumexp)",
      tags);
  // Returns the gradients of query, key, value and of the bias (an empty
  // tensor unless bias_grad), in the stock backward's layouts.
  defs.def(
      "monitored_attention_backward(str op, Tensor grad_out, Tensor query, Tensor key, Tensor value, "
      "Tensor? attn_mask, Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, float? scale, "
      "bool bias_grad) -> (Tensor grad_query, Tensor grad_key, Tensor grad_value, Tensor grad_bias)",
      tags);
  for (auto key : {c10::DispatchKey::CPU, c10::DispatchKey::CUDA}) {
    defs.impl("monitored_attention", torch::dispatch(key, TORCH_FN(monitored_attention)));
    defs.impl("monitored_attention_backward", torch::dispatch(key, TORCH_FN(monitored_attention_backward)));
  }
  defs.impl("monitored_attention", torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(monitored_attention_meta)));
  defs.impl("monitored_attention_backward",
            torch::dispatch(c10::DispatchKey::Meta, TORCH_FN(monitored_attention_backward_meta)));
}

}  // namespace gaugewatch::hooks
