#pragma once
// A captured attention call: the operands a fused backward reads (q, k, v,
// out, lse, grad_out) plus causal mode, scale and optional packing, stored
// as a safetensors file. This is the file the hooks' capture writes and
// `gaugewatch audit --input` reads; Python's safetensors package reads and
// writes the same files.
//
// Tensors: q, out, grad_out (B, Hq, N, d) BF16; k, v (B, Hkv, M, d) BF16;
// lse (B, Hq, N) F32 (natural log, SDPA's flash layout); optional
// cu_seqlens_q, cu_seqlens_k (S + 1,) I32/I64; optional attn_mask, SDPA's
// mask: BOOL (true = takes part) or F32/BF16/F16/F64 additive bias, 1 to 4
// dimensions broadcastable to (B, Hq, N, M) (saved as an F32 bias, -inf where
// masked). Metadata (strings): "causal"
// = none | top_left | bottom_right (also true/false = top_left/none, SDPA's
// is_causal), "scale" = a decimal number (default 1/sqrt(d)).

#include <string>

#include "kernels/reference/attention_problem.h"

namespace gaugewatch::audit {

struct CapturedOperands {
  reference::AttentionInputs inputs;
  reference::SavedForward saved;
};

// Throws std::runtime_error naming the file and what is wrong with it.
CapturedOperands load_operands(const std::string& path);
void save_operands(const std::string& path, const CapturedOperands& operands);

}  // namespace gaugewatch::audit
