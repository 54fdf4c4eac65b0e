#include "hooks/call_coverage.h"

#include "hooks/gaugewatch_ops.h"

namespace gaugewatch::hooks {
namespace {

bool fused_kernels_take(const CallInfo& info, const at::Tensor& q) {
  if (info.dropout_p != 0.0 || info.mask().defined()) return false;
  if (!q.is_cuda()) return true;  // the CPU reference takes every head dim
  // The CUDA kernels' head dims (kernels/torch/ops_cuda.cpp): the fused BF16
  // backward and the FP32 one both take 64, 128 and 256.
  const std::int64_t d = q.size(3);
  return d == 64 || d == 128 || d == 256;
}

}  // namespace

CallVerdict classify(const CallInfo& info, const at::Tensor& q, const at::Tensor& k) {
  CallVerdict v;
  const bool layout_ok = q.dim() == 4 && k.dim() == 4 && !q.is_nested() && !info.cum_seq_q.defined() &&
                         q.size(1) % k.size(1) == 0;
  const bool bf16 = q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16;
  if (!layout_ok) {
    v = {false, "layout", {}};
  } else if (!bf16) {
    v = {false, "dtype", {}};
  } else if (info.dropout_p != 0.0) {
    v = {false, "dropout", {}};
  } else if (info.mask().defined() && !op_takes("attention_metrics", "attn_mask")) {
    v = {false, "mask", {}};
  }
  if (!layout_ok) return v;
  if (bf16 && fused_kernels_take(info, q)) {
    for (Backend b : {Backend::kGproj, Backend::kPivot, Backend::kFp32}) v.correcting.push_back(b);
  }
  // The intercepted op's own backward on centred keys: every call it takes.
  if (op_unavailable("center_keys").empty()) v.correcting.push_back(Backend::kCenter);
  return v;
}

CallVerdict classify_math_path(double dropout_p) {
  return {false, dropout_p != 0.0 ? "dropout" : "math_path", {}};
}

}  // namespace gaugewatch::hooks
