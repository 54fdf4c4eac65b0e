#pragma once
// The operands of one attention call, as the CPU reference sees them.
//
// Layout is PyTorch SDPA's: q, grad_out, out are (B, Hq, N, d); k, v are
// (B, Hkv, M, d); lse is (B, Hq, N). Values are stored as float (BF16 operands
// are exactly representable in float) or double for the FP64 reference.
//
// GQA/MQA: Hkv divides Hq; query head h reads key/value head h / (Hq / Hkv),
// which is what SDPA's enable_gqa (repeat_interleave) and FlashAttention do.
//
// Packed sequences: cu_seqlens_q / cu_seqlens_k hold S + 1 offsets into the
// N and M axes (FlashAttention's varlen convention, applied to every batch
// element; packed inputs normally have B = 1). A query row attends only to
// keys of its own segment; causal alignment is applied per segment.

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace gaugewatch::reference {

enum class CausalMode {
  kNone,
  // PyTorch SDPA is_causal=True: query row i (0-based within its sequence)
  // sees keys j <= i. With N > M the last rows see every key; with N < M the
  // keys past N are never seen.
  kTopLeft,
  // FlashAttention causal=True: the diagonal ends at the bottom-right corner,
  // row i sees keys j <= i + (M - N). With N > M the first N - M rows see no
  // key at all (output 0, lse = +inf, gradient 0).
  kBottomRight,
};

std::string_view to_string(CausalMode mode);
// Accepts "none", "top_left", "bottom_right" (and "false"/"true" for
// none/top_left, matching SDPA's is_causal). Throws std::invalid_argument.
CausalMode parse_causal_mode(std::string_view text);

struct AttentionShape {
  int64_t batch = 1;
  int64_t q_heads = 1;   // Hq
  int64_t kv_heads = 1;  // Hkv, divides Hq
  int64_t q_len = 1;     // N
  int64_t kv_len = 1;    // M
  int64_t head_dim = 64; // d

  int64_t group() const { return q_heads / kv_heads; }
  int64_t q_elements() const { return batch * q_heads * q_len * head_dim; }
  int64_t kv_elements() const { return batch * kv_heads * kv_len * head_dim; }
  int64_t q_rows() const { return batch * q_heads * q_len; }
  // Offset of row n of (batch b, query head h) in a (B, Hq, N, d) tensor.
  int64_t q_offset(int64_t b, int64_t h, int64_t n) const {
    return ((b * q_heads + h) * q_len + n) * head_dim;
  }
  // Offset of row m of (batch b, key/value head hk) in a (B, Hkv, M, d) tensor.
  int64_t kv_offset(int64_t b, int64_t hk, int64_t m) const {
    return ((b * kv_heads + hk) * kv_len + m) * head_dim;
  }
  int64_t lse_offset(int64_t b, int64_t h, int64_t n) const {
    return (b * q_heads + h) * q_len + n;
  }
};

// SDPA's attn_mask as an additive bias on the scaled scores alpha q.k: a
// floating mask as given, a bool mask as 0 (True, takes part) / -inf (False).
// Any shape broadcastable to (B, Hq, N, M): `sizes` is the mask's shape with
// leading 1s added, each entry 1 (broadcast) or the full size. A pair whose
// bias is -inf is masked out; a row whose visible keys are all masked out sees
// no key (output 0, zero gradients: what SDPA's CPU math and flash paths give).
struct AttentionBias {
  std::vector<float> values;  // the mask's own elements, row-major over `sizes`
  std::array<int64_t, 4> sizes{1, 1, 1, 1};

  bool empty() const { return values.empty(); }
};

// One query row's bias along M: bias[j] (0 when there is no mask).
class BiasRow {
 public:
  BiasRow() = default;
  BiasRow(const float* first, int64_t key_stride) : first_(first), key_stride_(key_stride) {}
  bool empty() const { return first_ == nullptr; }
  float operator[](int64_t j) const { return first_ == nullptr ? 0.0f : first_[j * key_stride_]; }
  // Whether key j takes part (its bias is not -inf).
  bool keeps(int64_t j) const { return first_ == nullptr || first_[j * key_stride_] != -std::numeric_limits<float>::infinity(); }

 private:
  const float* first_ = nullptr;
  int64_t key_stride_ = 0;
};

// The inputs every backend shares. Throws std::invalid_argument from
// validate() with a message naming the first inconsistency.
struct AttentionInputs {
  AttentionShape shape;
  std::vector<float> q;         // (B, Hq, N, d)
  std::vector<float> k;         // (B, Hkv, M, d)
  std::vector<float> v;         // (B, Hkv, M, d)
  std::vector<float> grad_out;  // (B, Hq, N, d), "dO"
  double scale = 0.125;         // alpha
  CausalMode causal = CausalMode::kNone;
  std::vector<int64_t> cu_seqlens_q;  // empty, or S + 1 offsets into N
  std::vector<int64_t> cu_seqlens_k;  // empty, or S + 1 offsets into M
  AttentionBias bias;                 // empty: no attn_mask

  void validate() const;
  bool packed() const { return !cu_seqlens_q.empty(); }
  // The bias of query row n of (batch b, query head h).
  BiasRow bias_row(int64_t b, int64_t h, int64_t n) const;
};

// What a fused BF16 forward saves for its backward.
struct SavedForward {
  std::vector<float> out;  // (B, Hq, N, d), BF16 values
  std::vector<float> lse;  // (B, Hq, N), FP32 natural log; +inf for rows with no key
};

// The keys visible to one query row: the half-open range [begin, end) of
// key indices along M. Empty when begin == end.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Visible keys of query row n (0-based along N) under the inputs' masking
// and packing. The single place masking semantics are defined.
KeyRange visible_keys(const AttentionInputs& in, int64_t n);

// Whether query row n of (b, h) sees at least one key: a visible key whose
// bias is not -inf.
bool sees_a_key(const AttentionInputs& in, int64_t b, int64_t h, int64_t n);

}  // namespace gaugewatch::reference
