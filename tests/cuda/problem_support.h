#pragma once
// Shared by the CUDA kernel tests: a named attention problem with BF16-valued
// normal operands (optionally a common key offset and sharper queries: the
// sink-like regime), and the conversions between the reference's float
// vectors and the kernels' BF16 bits / int32 offsets (the problem's shape:
// kernels/cuda/reference_problem.h).

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/problem.h"
#include "kernels/cuda/reference_problem.h"
#include "kernels/reference/attention_problem.h"
#include "kernels/reference/bf16.h"

namespace gaugewatch::testing_cuda {

namespace ref = gaugewatch::reference;

struct KernelCase {
  std::string name;
  ref::AttentionShape shape;
  ref::CausalMode causal = ref::CausalMode::kNone;
  std::vector<int64_t> cu_q, cu_k;  // packed when non-empty
  float key_offset = 0.0f;          // RMS per coordinate of an offset common to every key
  float q_gain = 1.0f;              // query scale: sharper attention
  double scale = 0.0;               // softmax scale; 0: 1 / sqrt(d)
  uint64_t seed = 1;
  ref::AttentionBias bias;          // attn_mask as a bias; empty: none
};

inline void PrintTo(const KernelCase& c, std::ostream* os) { *os << c.name; }

inline ref::AttentionShape shape(int64_t b, int64_t hq, int64_t hkv, int64_t n, int64_t m, int64_t d) {
  return {.batch = b, .q_heads = hq, .kv_heads = hkv, .q_len = n, .kv_len = m, .head_dim = d};
}

inline ref::AttentionInputs make_inputs(const KernelCase& c) {
  ref::AttentionInputs in;
  in.shape = c.shape;
  in.causal = c.causal;
  in.cu_seqlens_q = c.cu_q;
  in.cu_seqlens_k = c.cu_k;
  in.scale = c.scale != 0.0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.shape.head_dim));
  std::mt19937_64 rng(c.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& t, int64_t n, float gain) {
    t.resize(static_cast<size_t>(n));
    for (auto& x : t) x = ref::round_bf16(gain * normal(rng));
  };
  fill(in.q, c.shape.q_elements(), c.q_gain);
  fill(in.k, c.shape.kv_elements(), 1.0f);
  fill(in.v, c.shape.kv_elements(), 1.0f);
  fill(in.grad_out, c.shape.q_elements(), 1.0f);
  if (c.key_offset != 0.0f) {
    std::vector<float> offset(static_cast<size_t>(c.shape.head_dim));
    for (auto& x : offset) x = c.key_offset * normal(rng);
    for (size_t i = 0; i < in.k.size(); ++i) in.k[i] = ref::round_bf16(in.k[i] + offset[i % offset.size()]);
  }
  in.bias = c.bias;
  in.validate();
  return in;
}

using gpu::to_gpu;

// A parameter block's ProblemShape from a reference problem; cu_q / cu_k
// (its offsets on the device) are used only when the problem is packed.
inline gpu::ProblemShape problem_shape(const ref::AttentionInputs& in, const int32_t* cu_q, const int32_t* cu_k) {
  if (in.packed()) {
    return gpu::problem_shape(in.shape, in.scale, in.causal, cu_q, cu_k,
                              static_cast<int64_t>(in.cu_seqlens_q.size()) - 1);
  }
  return gpu::problem_shape(in.shape, in.scale, in.causal);
}

// BF16-valued floats to their 16-bit storage (exact) and back.
inline std::vector<uint16_t> to_bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) bits[i] = ref::float_to_bf16_bits(x[i]);
  return bits;
}

inline std::vector<float> from_bf16_bits(const std::vector<uint16_t>& bits) {
  std::vector<float> x(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(&x[i], &u, sizeof u);
  }
  return x;
}

inline std::vector<int32_t> to_int32(const std::vector<int64_t>& x) { return std::vector<int32_t>(x.begin(), x.end()); }

using Case = KernelCase;

}  // namespace gaugewatch::testing_cuda
