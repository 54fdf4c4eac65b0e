#pragma once
// What every CUDA launcher of gaugewatch shares (the FP32 backward, the fused
// BF16 backward, the metric reductions, key centring): the attention problem's
// shape and masking (ProblemShape, one per parameter block), the causal modes,
// and the launchers' status. Host and device code; no kernels.

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace gaugewatch::gpu {

enum class CausalMode : int {
  kNone = 0,
  kTopLeft = 1,      // SDPA is_causal: row i sees keys j <= i
  kBottomRight = 2,  // FlashAttention causal: row i sees keys j <= i + M - N
};

// Result of a launcher: a CUDA error, or a validation message (never both
// empty unless the call succeeded).
struct Status {
  cudaError_t cuda = cudaSuccess;
  std::string message;  // empty on success
  bool ok() const { return cuda == cudaSuccess && message.empty(); }
};

// Element type of a tensor the kernels read or write (16-bit types as raw storage).
enum class ElementType : int {
  kBf16 = 0,
  kFp32 = 1,
  kFp16 = 2,
};

// Element strides of a (B, H, L, d) operand; the last dim is contiguous.
struct OperandStrides {
  int64_t batch = 0, head = 0, row = 0;
};

// SDPA's attn_mask: boolean (True: the key takes part) or an additive bias
// on the scaled logits, broadcast to (B, Hq, N, M) by its element strides (0
// along a broadcast dimension: stride-0 views are read in place).
enum class MaskKind : int {
  kNone = 0,
  kBool = 1,  // uint8 storage, nonzero: takes part
  kBias = 2,  // float32, added to alpha s_ij
};

struct AttentionMask {
  MaskKind kind = MaskKind::kNone;
  const void* data = nullptr;         // device
  int64_t strides[4] = {0, 0, 0, 0};  // along B, Hq, N, M
  bool any() const { return kind != MaskKind::kNone; }
};

// Shape, softmax scale, causal mode, packing and mask of one attention call:
//   q, grad_out, out: (B, Hq, N, d)   k, v: (B, Hkv, M, d)   lse: (B, Hq, N)
// GQA/MQA when Hkv divides Hq (query head h uses key/value head h / (Hq / Hkv)).
// Packed sequences (FlashAttention varlen): both offset arrays null, or both
// num_segments + 1 int32 device offsets into N and M, applied to every batch
// element (kernels/cuda/masking.cuh says which keys a row then sees).
struct ProblemShape {
  int64_t batch = 1;
  int64_t q_heads = 1;   // Hq
  int64_t kv_heads = 1;  // Hkv
  int64_t q_len = 1;     // N
  int64_t kv_len = 1;    // M
  int64_t head_dim = 64;
  double scale = 0.125;  // alpha; the FP32 and BF16 kernels compute with float(scale)
  CausalMode causal = CausalMode::kNone;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t num_segments = 0;
  AttentionMask mask;  // on top of causal masking and packing

  bool packed() const { return cu_seqlens_q != nullptr; }
  int64_t group() const { return q_heads / kv_heads; }  // query heads per key/value head
  int64_t q_rows() const { return batch * q_heads * q_len; }
  int64_t q_elements() const { return q_rows() * head_dim; }
  int64_t kv_elements() const { return batch * kv_heads * kv_len * head_dim; }
};

}  // namespace gaugewatch::gpu
