#pragma once
// torch.compile: the interception as opaque custom ops in the compiled graph
// (docs/hooks.md, "torch.compile").
//
// While PyTorch traces (Dynamo's fake-tensor propagation, AOTAutograd,
// make_fx, torch.export: a fake, proxy or functional dispatch mode is
// active), the autograd kernels of the intercepted SDPA ops run none of the
// runtime: they call gaugewatch::monitored_attention below autograd, inside an
// autograd Function whose backward calls
// gaugewatch::monitored_attention_backward. Both ops are opaque to the
// compiler (Meta kernels give their outputs' shapes and strides) and are
// tagged cudagraph_unsafe, so Inductor keeps them out of CUDA graphs. At run
// time their CPU / CUDA kernels do what the eager interception does at each
// call: the forward asks the runtime for the call's layer, step and backend
// and runs the stock forward; the backward runs the layer's backend (stock
// when it cannot run), records it and audits sampled calls. A backend change
// therefore reaches a compiled model without recompiling.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "hooks/sdpa_ops.h"

namespace torch {
class Library;
}

namespace gaugewatch::hooks {

// True while PyTorch traces instead of running (see above).
bool tracing();

// The traced call: (out, lse) of gaugewatch::monitored_attention on (q, k, v),
// differentiable through gaugewatch::monitored_attention_backward when
// `grad` (else called directly). `mask` is the CPU flash op's attn_mask or
// the cuDNN / efficient op's bias; `bias_grad`: efficient attention's bias
// needs a gradient (it is then an input of the autograd Function).
std::tuple<at::Tensor, at::Tensor> traced_attention(OpKind kind, const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const std::optional<at::Tensor>& mask,
                                                    double dropout_p, bool is_causal, std::optional<double> scale,
                                                    bool grad, bool bias_grad);

// Attention forwards and backwards that ran while a CUDA graph was being
// captured (unmonitored, reason "cudagraphs").
std::uint64_t captured_attention_calls();

// Defines the two ops in `defs` (a FRAGMENT of namespace gaugewatch, whose
// other ops libgaugewatch_ops defines) with their CPU, CUDA and Meta kernels.
void register_compile_ops(torch::Library& defs);

}  // namespace gaugewatch::hooks
