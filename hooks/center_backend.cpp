#include "hooks/center_backend.h"

#include <c10/util/Exception.h>

#include "hooks/gaugewatch_ops.h"
#include "hooks/torch_errors.h"

namespace gaugewatch::hooks {

using at::Tensor;

std::optional<std::array<Tensor, 4>> center_backward(const CallInfo& info, const Tensor& grad_out, const Tensor& q,
                                                     const Tensor& k, const Tensor& v, const Tensor& out,
                                                     const Tensor& lse, std::string* why) {
  if (std::string missing = op_unavailable("center_keys"); !missing.empty()) {
    *why = missing;
    return std::nullopt;
  }
  if (q.dim() != 4 || k.dim() != 4 || q.is_nested() || info.cum_seq_q.defined()) {
    *why = "not (B, H, N, d)";
    return std::nullopt;
  }
  try {
    // center_keys (two kernels: kernels/cuda/key_centring.h) takes lse
    // (B, Hq, L >= N) and leaves entries >= N as they are (efficient
    // attention's padding); cuDNN's (B, H, N, 1) goes in as (B, H, N) and
    // comes back in its own shape. Its outputs are the only allocations
    // around the stock backward: K - kbar, the shifted lse and kbar.
    const bool cudnn_layout = lse.dim() == 4 && lse.size(3) == 1;
    const Tensor lse3 = cudnn_layout ? lse.select(3, 0) : lse;
    const c10::IValue result = call_op("center_keys", {{"q", q}, {"k", k}, {"lse", lse3}, {"scale", info.scale}});
    const auto& centred = result.toTupleRef().elements();
    const Tensor k_centred = centred.at(0).toTensor();
    Tensor lse_shifted = centred.at(1).toTensor();
    // lse_shifted is contiguous (B, H, L): as a (B, H, N, 1) view it is
    // cuDNN's layout too, so the backward gets it without a copy.
    if (cudnn_layout) lse_shifted = lse_shifted.unsqueeze(3);
    auto g = stock_backward(info, grad_out, q, k_centred, v, out, lse_shifted);
    // dK of the centred keys is dK. k_centred is dense in k's dimension order,
    // so the stock backward lays dK out as for k and this returns it as it
    // is; a layout it would not give is copied to stock's.
    g[1] = stock_grad_layout(g[1], k, info.kind);
    return g;
  } catch (const std::exception& e) {
    *why = short_what(e);
    return std::nullopt;
  }
}

}  // namespace gaugewatch::hooks
