#include "kernels/reference/attention_problem.h"

#include <algorithm>
#include <array>
#include <sstream>
#include <stdexcept>

namespace gaugewatch::reference {

std::string_view to_string(CausalMode mode) {
  switch (mode) {
    case CausalMode::kNone: return "none";
    case CausalMode::kTopLeft: return "top_left";
    case CausalMode::kBottomRight: return "bottom_right";
  }
  return "unknown";
}

CausalMode parse_causal_mode(std::string_view text) {
  if (text == "none" || text == "false" || text == "0") return CausalMode::kNone;
  if (text == "top_left" || text == "true" || text == "1") return CausalMode::kTopLeft;
  if (text == "bottom_right") return CausalMode::kBottomRight;
  throw std::invalid_argument("unknown causal mode '" + std::string(text) +
                              "': use none, top_left (SDPA is_causal) or bottom_right "
                              "(FlashAttention causal)");
}

namespace {

void check_offsets(const std::vector<int64_t>& offsets, int64_t length, const char* name) {
  if (offsets.size() < 2) {
    throw std::invalid_argument(std::string(name) + " needs at least 2 offsets (S + 1 for S segments)");
  }
  if (offsets.front() != 0 || offsets.back() != length) {
    std::ostringstream msg;
    msg << name << " must start at 0 and end at the sequence length " << length << ", got "
        << offsets.front() << " .. " << offsets.back();
    throw std::invalid_argument(msg.str());
  }
  if (!std::is_sorted(offsets.begin(), offsets.end())) {
    throw std::invalid_argument(std::string(name) + " must be non-decreasing");
  }
}

}  // namespace

void AttentionInputs::validate() const {
  const auto& s = shape;
  if (s.batch < 1 || s.q_heads < 1 || s.kv_heads < 1 || s.q_len < 1 || s.kv_len < 1 ||
      s.head_dim < 1) {
    throw std::invalid_argument("every dimension (B, Hq, Hkv, N, M, d) must be >= 1");
  }
  if (s.q_heads % s.kv_heads != 0) {
    std::ostringstream msg;
    msg << "GQA needs key/value heads to divide query heads; got Hq=" << s.q_heads
        << ", Hkv=" << s.kv_heads;
    throw std::invalid_argument(msg.str());
  }
  auto check_size = [](const std::vector<float>& t, int64_t expected, const char* name) {
    if (static_cast<int64_t>(t.size()) != expected) {
      std::ostringstream msg;
      msg << name << " has " << t.size() << " elements, the shape needs " << expected;
      throw std::invalid_argument(msg.str());
    }
  };
  check_size(q, s.q_elements(), "q");
  check_size(grad_out, s.q_elements(), "grad_out");
  check_size(k, s.kv_elements(), "k");
  check_size(v, s.kv_elements(), "v");
  if (cu_seqlens_q.empty() != cu_seqlens_k.empty()) {
    throw std::invalid_argument("packed sequences need both cu_seqlens_q and cu_seqlens_k");
  }
  if (packed()) {
    if (cu_seqlens_q.size() != cu_seqlens_k.size()) {
      throw std::invalid_argument("cu_seqlens_q and cu_seqlens_k must have the same number of segments");
    }
    check_offsets(cu_seqlens_q, s.q_len, "cu_seqlens_q");
    check_offsets(cu_seqlens_k, s.kv_len, "cu_seqlens_k");
  }
  if (!(scale == scale)) throw std::invalid_argument("scale is NaN");
  if (!bias.empty()) {
    const std::array<int64_t, 4> full{s.batch, s.q_heads, s.q_len, s.kv_len};
    int64_t count = 1;
    for (size_t i = 0; i < 4; ++i) {
      if (bias.sizes[i] != 1 && bias.sizes[i] != full[i]) {
        std::ostringstream msg;
        msg << "attn_mask dimension " << i << " has size " << bias.sizes[i] << ", broadcastable to " << full[i]
            << " needs 1 or " << full[i];
        throw std::invalid_argument(msg.str());
      }
      count *= bias.sizes[i];
    }
    if (static_cast<int64_t>(bias.values.size()) != count) {
      std::ostringstream msg;
      msg << "attn_mask has " << bias.values.size() << " elements, its sizes need " << count;
      throw std::invalid_argument(msg.str());
    }
  }
}

BiasRow AttentionInputs::bias_row(int64_t b, int64_t h, int64_t n) const {
  if (bias.empty()) return {};
  const auto& z = bias.sizes;
  const int64_t bb = z[0] == 1 ? 0 : b, hh = z[1] == 1 ? 0 : h, nn = z[2] == 1 ? 0 : n;
  const int64_t offset = ((bb * z[1] + hh) * z[2] + nn) * z[3];
  return BiasRow(&bias.values[static_cast<size_t>(offset)], z[3] == 1 ? 0 : 1);
}

bool sees_a_key(const AttentionInputs& in, int64_t b, int64_t h, int64_t n) {
  const KeyRange keys = visible_keys(in, n);
  const BiasRow bias = in.bias_row(b, h, n);
  for (int64_t j = keys.begin; j < keys.end; ++j) {
    if (bias.keeps(j)) return true;
  }
  return false;
}

KeyRange visible_keys(const AttentionInputs& in, int64_t n) {
  // Locate the row's sequence: the whole axis, or its packed segment.
  int64_t q_begin = 0, q_end = in.shape.q_len, k_begin = 0, k_end = in.shape.kv_len;
  if (in.packed()) {
    const auto it = std::upper_bound(in.cu_seqlens_q.begin(), in.cu_seqlens_q.end(), n);
    const auto segment = static_cast<size_t>(it - in.cu_seqlens_q.begin()) - 1;
    q_begin = in.cu_seqlens_q[segment];
    q_end = in.cu_seqlens_q[segment + 1];
    k_begin = in.cu_seqlens_k[segment];
    k_end = in.cu_seqlens_k[segment + 1];
  }
  const int64_t row = n - q_begin;  // index within its sequence
  const int64_t rows = q_end - q_begin;
  const int64_t keys = k_end - k_begin;
  int64_t last = keys;  // exclusive, within the sequence
  switch (in.causal) {
    case CausalMode::kNone: break;
    case CausalMode::kTopLeft: last = std::min(keys, row + 1); break;
    case CausalMode::kBottomRight: last = std::clamp<int64_t>(row + 1 + (keys - rows), 0, keys); break;
  }
  return {k_begin, k_begin + last};
}

}  // namespace gaugewatch::reference
