#include "audit/scenarios.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "audit/random_normal.h"
#include "kernels/reference/bf16.h"

namespace gaugewatch::audit {

namespace {

using reference::AttentionInputs;
using reference::AttentionShape;
using reference::CausalMode;
using reference::round_bf16;

std::vector<int64_t> offsets_of(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> offsets{0};
  for (int64_t len : lengths) offsets.push_back(offsets.back() + len);
  return offsets;
}

void fill_normal(std::vector<float>& t, int64_t count, RandomNormal& rng, double gain = 1.0) {
  t.resize(count);
  for (auto& x : t) x = round_bf16(static_cast<float>(gain * rng()));
}

// Adds a common vector (one per key/value or query head) to every row, then
// rounds to BF16 again.
void add_common_offset(std::vector<float>& t, int64_t heads_total, int64_t rows, int64_t d,
                       double rms, RandomNormal& rng) {
  if (rms == 0.0) return;
  std::vector<double> offset(d);
  for (int64_t h = 0; h < heads_total; ++h) {
    for (auto& x : offset) x = rms * rng();
    for (int64_t r = 0; r < rows; ++r) {
      float* row = &t[(h * rows + r) * d];
      for (int64_t c = 0; c < d; ++c) row[c] = round_bf16(static_cast<float>(row[c] + offset[c]));
    }
  }
}

Scenario make(std::string name, std::string kind, AttentionShape shape, CausalMode causal,
              std::string description, double gain = 1.0, double key_offset = 0.0) {
  ScenarioSpec spec;
  spec.kind = std::move(kind);
  spec.shape = shape;
  spec.causal = causal;
  spec.query_gain = gain;
  spec.key_offset_rms = key_offset;
  return Scenario{std::move(name), spec, std::move(description)};
}

}  // namespace

std::vector<std::string> scenario_kinds() {
  return {"witness", "random", "sink", "two_key", "massive_key", "clusters"};
}

const std::vector<Scenario>& scenario_catalogue() {
  static const std::vector<Scenario> catalogue = [] {
    const CausalMode tl = CausalMode::kTopLeft;
    std::vector<Scenario> s;
    ScenarioSpec witness;
    witness.kind = "witness";
    witness.shape = {1, 1, 1, 1, 4, 64};
    witness.causal = CausalMode::kNone;
    s.push_back({"witness", witness,
                 "the four-key witness (docs/numerics.md): uniform attention, keys at 65536; truth dq[0] = 0"});
    s.push_back(make("random", "random", {1, 4, 4, 1024, 1024, 64}, tl,
                     "normal q, k, v, dO; causal (SDPA top-left), N = 1024, d = 64"));
    s.push_back(make("sink", "sink", {1, 4, 4, 1024, 1024, 64}, tl,
                     "sink-like: common key offset RMS 200, sharp queries (gain 20)", 20.0, 200.0));
    s.push_back(make("sink_d128", "sink", {1, 4, 4, 1024, 1024, 128}, tl,
                     "sink-like, d = 128, key offset RMS 300", 20.0, 300.0));
    s.push_back(make("offset", "random", {1, 4, 4, 512, 512, 64}, tl,
                     "common key offset RMS 2048 on otherwise normal inputs (query gain 20)", 20.0,
                     2048.0));
    s.push_back(make("two_key", "two_key", {1, 4, 4, 512, 2, 64}, CausalMode::kNone,
                     "every row attends two keys with weights 1 - eps, eps; key offset RMS 100",
                     1.0, 100.0));
    s.push_back(make("massive_key", "massive_key", {1, 4, 4, 1024, 1024, 128}, tl,
                     "one key of norm 5000 dominates most rows; the others split their attention"));
    s.push_back(make("clusters", "clusters", {1, 4, 4, 1024, 1024, 64}, tl,
                     "two key clusters far apart, diffuse attention"));
    Scenario padded = make("padded_sink", "sink", {2, 4, 4, 512, 512, 64}, CausalMode::kNone,
                           "sink-like (key offset RMS 200, gain 20), left key padding as attn_mask: 512 and 300 "
                           "keys take part",
                           20.0, 200.0);
    padded.spec.valid_keys = {512, 300};
    padded.spec.left_padded = true;
    s.push_back(padded);
    return s;
  }();
  return catalogue;
}

const Scenario* find_scenario(const std::string& name) {
  for (const auto& s : scenario_catalogue()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

AttentionInputs four_key_witness() {
  AttentionInputs in;
  in.shape = {1, 1, 1, 1, 4, 64};
  in.scale = 0.125;
  in.causal = CausalMode::kNone;
  const int64_t d = 64;
  in.q.assign(d, 0.0f);
  in.k.assign(4 * d, 0.0f);
  in.v.assign(4 * d, 0.0f);
  in.grad_out.assign(d, 0.0f);
  for (int64_t j = 0; j < 4; ++j) {
    in.k[j * d + 0] = 65536.0f;                   // the shared key offset
    in.k[j * d + 1] = static_cast<float>(j);      // keys otherwise distinct
  }
  // a - delta = (4 + 3/256, -4, -3/256, 0) with dO = (1, 1, 0, ...):
  in.v[0 * d + 0] = 4.0f;
  in.v[0 * d + 1] = 3.0f / 256.0f;
  in.v[1 * d + 0] = -4.0f;
  in.v[2 * d + 1] = -3.0f / 256.0f;
  in.grad_out[0] = 1.0f;
  in.grad_out[1] = 1.0f;
  return in;
}

AttentionInputs make_inputs(const ScenarioSpec& spec) {
  if (spec.kind == "witness") return four_key_witness();
  AttentionInputs in;
  in.shape = spec.shape;
  in.causal = spec.causal;
  const AttentionShape& sh = in.shape;
  in.scale = spec.scale.value_or(1.0 / std::sqrt(static_cast<double>(sh.head_dim)));
  if (!spec.q_segments.empty() || !spec.k_segments.empty()) {
    in.cu_seqlens_q = offsets_of(spec.q_segments);
    in.cu_seqlens_k = offsets_of(spec.k_segments);
  }
  const int64_t d = sh.head_dim;
  RandomNormal rng(spec.seed);
  fill_normal(in.q, sh.q_elements(), rng, spec.query_gain);
  fill_normal(in.k, sh.kv_elements(), rng);
  fill_normal(in.v, sh.kv_elements(), rng);
  fill_normal(in.grad_out, sh.q_elements(), rng);
  const int64_t kv_heads_total = sh.batch * sh.kv_heads;

  // random, sink and two_key differ only in their parameters (shape, query
  // gain, common offsets): sink-like inputs are keys sharing a large offset
  // with sharp queries, so most rows put almost all weight on one key, as
  // late-training layers do. The two kinds below also reshape the keys.
  const auto kinds = scenario_kinds();
  if (std::find(kinds.begin(), kinds.end(), spec.kind) == kinds.end()) {
    throw std::invalid_argument("unknown scenario kind '" + spec.kind + "'");
  }
  if (spec.kind == "massive_key") {
    // Key 0 of every head has norm massive_key_norm along a random direction
    // u; queries with a positive component along u attend it with p ~ 1,
    // the others split their attention among the ordinary keys.
    std::vector<double> u(d);
    for (int64_t h = 0; h < kv_heads_total; ++h) {
      double norm = 0.0;
      for (auto& x : u) {
        x = rng();
        norm += x * x;
      }
      norm = std::sqrt(norm);
      float* k0 = &in.k[h * sh.kv_len * d];
      for (int64_t c = 0; c < d; ++c) {
        k0[c] = round_bf16(static_cast<float>(spec.massive_key_norm * u[c] / norm));
      }
    }
  } else if (spec.kind == "clusters") {
    // Two clusters of keys 64 apart per coordinate; attention stays diffuse.
    for (int64_t h = 0; h < kv_heads_total; ++h) {
      for (int64_t j = 0; j < sh.kv_len; ++j) {
        float* kj = &in.k[(h * sh.kv_len + j) * d];
        const float shift = (j % 2 == 0) ? 64.0f : -64.0f;
        for (int64_t c = 0; c < d; ++c) kj[c] = round_bf16(kj[c] * 0.25f + (c % 2 ? shift : 0.0f));
      }
    }
    for (auto& x : in.q) x = round_bf16(x * 0.05f);
  }
  add_common_offset(in.k, kv_heads_total, sh.kv_len, d, spec.key_offset_rms, rng);
  add_common_offset(in.q, sh.batch * sh.q_heads, sh.q_len, d, spec.query_offset_rms, rng);
  if (!spec.valid_keys.empty()) {
    if (static_cast<int64_t>(spec.valid_keys.size()) != sh.batch) {
      throw std::invalid_argument("valid_keys needs one key count per batch element");
    }
    in.bias.sizes = {sh.batch, 1, 1, sh.kv_len};
    in.bias.values.assign(static_cast<size_t>(sh.batch * sh.kv_len), 0.0f);
    for (int64_t b = 0; b < sh.batch; ++b) {
      const int64_t valid = spec.valid_keys[static_cast<size_t>(b)];
      for (int64_t j = 0; j < sh.kv_len; ++j) {
        const bool takes_part = spec.left_padded ? j >= sh.kv_len - valid : j < valid;
        if (!takes_part) in.bias.values[static_cast<size_t>(b * sh.kv_len + j)] = -INFINITY;
      }
    }
  }
  in.validate();
  return in;
}

}  // namespace gaugewatch::audit
