#include "tests/reference/suite_cases.h"

#include <cstdio>

namespace gaugewatch::testing {

namespace {

using reference::AttentionShape;
using reference::CausalMode;

std::string causal_tag(CausalMode c) {
  switch (c) {
    case CausalMode::kNone: return "full";
    case CausalMode::kTopLeft: return "tl";
    case CausalMode::kBottomRight: return "br";
  }
  return "?";
}

SuiteCase make_case(std::string name, CaseFamily family, std::string kind, AttentionShape shape,
                    CausalMode causal, uint64_t seed) {
  SuiteCase c{std::move(name), family, {}};
  c.spec.kind = std::move(kind);
  c.spec.shape = shape;
  c.spec.causal = causal;
  c.spec.seed = seed;
  return c;
}

}  // namespace

std::vector<SuiteCase> suite_cases() {
  std::vector<SuiteCase> cases;
  uint64_t seed = 100;
  const CausalMode modes[] = {CausalMode::kNone, CausalMode::kTopLeft, CausalMode::kBottomRight};

  // Random inputs at every head dim and masking mode.
  for (int64_t d : {64, 128, 256}) {
    for (CausalMode c : modes) {
      cases.push_back(make_case("random_d" + std::to_string(d) + "_" + causal_tag(c), CaseFamily::kRandom,
                                "random", {1, 2, 2, 256, 256, d}, c, ++seed));
    }
  }
  // N != M and lengths off any tile size, both causal alignments.
  const std::pair<int64_t, int64_t> lengths[] = {{100, 300}, {300, 100}, {1, 257}, {257, 1}, {77, 77}};
  for (auto [n, m] : lengths) {
    for (CausalMode c : {CausalMode::kTopLeft, CausalMode::kBottomRight}) {
      cases.push_back(make_case("lengths_" + std::to_string(n) + "x" + std::to_string(m) + "_" + causal_tag(c),
                                CaseFamily::kStructure, "random", {1, 2, 2, n, m, 64}, c, ++seed));
    }
  }
  // Singleton rows and keys.
  cases.push_back(make_case("single_1x1", CaseFamily::kStructure, "random", {2, 2, 2, 1, 1, 64},
                            CausalMode::kNone, ++seed));
  cases.push_back(make_case("single_query_1x64", CaseFamily::kStructure, "random", {1, 2, 2, 1, 64, 128},
                            CausalMode::kNone, ++seed));
  cases.push_back(make_case("single_key_64x1", CaseFamily::kStructure, "random", {1, 2, 2, 64, 1, 64},
                            CausalMode::kNone, ++seed));
  // Packed sequences (one batch element, segments along N and M).
  struct Packing {
    const char* name;
    std::vector<int64_t> q, k;
    CausalMode causal;
    int64_t d;
  };
  const Packing packings[] = {
      {"packed_equal_tl", {128, 1, 200, 63}, {128, 1, 200, 63}, CausalMode::kTopLeft, 64},
      {"packed_equal_full", {128, 1, 200, 63}, {128, 1, 200, 63}, CausalMode::kNone, 128},
      {"packed_ragged_br", {100, 5, 250, 40}, {60, 30, 250, 90}, CausalMode::kBottomRight, 64},
      {"packed_ragged_tl", {100, 5, 250, 40}, {60, 30, 250, 90}, CausalMode::kTopLeft, 128},
      {"packed_empty_segments", {50, 0, 70, 16}, {60, 10, 70, 0}, CausalMode::kNone, 64},
      {"packed_singletons_br", {1, 1, 1, 300}, {1, 2, 3, 300}, CausalMode::kBottomRight, 256},
  };
  for (const auto& p : packings) {
    int64_t n = 0, m = 0;
    for (auto x : p.q) n += x;
    for (auto x : p.k) m += x;
    SuiteCase c = make_case(p.name, CaseFamily::kStructure, "random", {1, 2, 2, n, m, p.d}, p.causal, ++seed);
    c.spec.q_segments = p.q;
    c.spec.k_segments = p.k;
    cases.push_back(c);
  }
  // GQA and MQA.
  cases.push_back(make_case("gqa_8to2_tl_d128", CaseFamily::kStructure, "random", {2, 8, 2, 192, 192, 128},
                            CausalMode::kTopLeft, ++seed));
  cases.push_back(make_case("mqa_8to1_br_d64", CaseFamily::kStructure, "random", {1, 8, 1, 160, 200, 64},
                            CausalMode::kBottomRight, ++seed));
  cases.push_back(make_case("gqa_4to2_full_d256", CaseFamily::kStructure, "random", {1, 4, 2, 96, 96, 256},
                            CausalMode::kNone, ++seed));
  SuiteCase gqa_sink = make_case("gqa_sink_8to2_tl", CaseFamily::kSinkLike, "sink", {1, 8, 2, 256, 256, 128},
                                 CausalMode::kTopLeft, ++seed);
  gqa_sink.spec.query_gain = 20.0;
  gqa_sink.spec.key_offset_rms = 300.0;
  cases.push_back(gqa_sink);
  // Custom scales.
  for (double scale : {0.05, 0.3}) {
    SuiteCase c = make_case(scale < 0.1 ? "scale_small" : "scale_large", CaseFamily::kRandom, "random",
                            {1, 2, 2, 200, 200, 64}, CausalMode::kTopLeft, ++seed);
    c.spec.scale = scale;
    cases.push_back(c);
  }
  // Long sequences (the CPU reference is O(N M d); these dominate the suite's time).
  cases.push_back(make_case("long_8192_tl_d64", CaseFamily::kRandom, "random", {1, 1, 1, 8192, 8192, 64},
                            CausalMode::kTopLeft, ++seed));
  {
    SuiteCase c = make_case("long_sink_8192_br_d128", CaseFamily::kSinkLike, "sink", {1, 1, 1, 8192, 8192, 128},
                            CausalMode::kBottomRight, ++seed);
    c.spec.query_gain = 20.0;
    c.spec.key_offset_rms = 200.0;
    cases.push_back(c);
  }
  {
    SuiteCase c = make_case("long_packed_2x6144_tl_d64", CaseFamily::kStructure, "random",
                            {1, 1, 1, 12288, 12288, 64}, CausalMode::kTopLeft, ++seed);
    c.spec.q_segments = {6144, 6144};
    c.spec.k_segments = {6144, 6144};
    cases.push_back(c);
  }
  // Sink-like: large common key offsets, sharp queries, optional query offsets.
  struct Sink {
    double key_offset, gain, query_offset;
    int64_t d;
    CausalMode causal;
  };
  const Sink sinks[] = {
      {100, 20, 0, 64, CausalMode::kTopLeft},    {200, 20, 0, 64, CausalMode::kTopLeft},
      {200, 10, 0, 64, CausalMode::kBottomRight}, {200, 40, 0, 64, CausalMode::kNone},
      {300, 20, 0, 128, CausalMode::kTopLeft},   {300, 20, 0, 128, CausalMode::kBottomRight},
      {1000, 20, 0, 64, CausalMode::kTopLeft},   {1000, 10, 0, 128, CausalMode::kNone},
      {200, 20, 40, 64, CausalMode::kTopLeft},   {200, 20, 100, 64, CausalMode::kTopLeft},
      {300, 20, 40, 128, CausalMode::kBottomRight}, {300, 20, 100, 128, CausalMode::kNone},
      {200, 20, 0, 256, CausalMode::kTopLeft},   {500, 30, 60, 256, CausalMode::kBottomRight},
      {200, 5, 0, 64, CausalMode::kTopLeft},     {400, 20, 0, 64, CausalMode::kNone},
  };
  for (const auto& s : sinks) {
    char name[96];
    std::snprintf(name, sizeof name, "sink_k%.0f_g%.0f_q%.0f_d%ld_%s", s.key_offset, s.gain, s.query_offset,
                  static_cast<long>(s.d), causal_tag(s.causal).c_str());
    SuiteCase c = make_case(name, CaseFamily::kSinkLike, "sink", {1, 2, 2, 512, 512, s.d}, s.causal, ++seed);
    c.spec.key_offset_rms = s.key_offset;
    c.spec.query_gain = s.gain;
    c.spec.query_offset_rms = s.query_offset;
    cases.push_back(c);
  }
  // Common key translations of growing norm (64, 1024, 16384; per-coordinate
  // RMS = norm / sqrt(d)) on sharp random inputs.
  for (double norm : {64.0, 1024.0, 16384.0}) {
    SuiteCase c = make_case("translated_" + std::to_string(static_cast<int>(norm)), CaseFamily::kGeometry,
                            "random", {1, 2, 2, 256, 256, 64}, CausalMode::kTopLeft, ++seed);
    c.spec.query_gain = 20.0;
    c.spec.key_offset_rms = norm / 8.0;
    cases.push_back(c);
  }
  // Two-key rows, one massive key, two key clusters.
  for (double offset : {0.0, 100.0}) {
    SuiteCase c = make_case("two_key_offset" + std::to_string(static_cast<int>(offset)), CaseFamily::kGeometry,
                            "two_key", {1, 2, 2, 256, 2, 64}, CausalMode::kNone, ++seed);
    c.spec.key_offset_rms = offset;
    cases.push_back(c);
  }
  cases.push_back(make_case("massive_key_d128_tl", CaseFamily::kGeometry, "massive_key", {1, 2, 2, 512, 512, 128},
                            CausalMode::kTopLeft, ++seed));
  cases.push_back(make_case("massive_key_d64_full", CaseFamily::kGeometry, "massive_key", {1, 2, 2, 384, 384, 64},
                            CausalMode::kNone, ++seed));
  cases.push_back(make_case("clusters_d64_tl", CaseFamily::kGeometry, "clusters", {1, 2, 2, 512, 512, 64},
                            CausalMode::kTopLeft, ++seed));
  cases.push_back(make_case("clusters_d128_full", CaseFamily::kGeometry, "clusters", {1, 2, 2, 384, 384, 128},
                            CausalMode::kNone, ++seed));
  // Key padding as an attn_mask, right and left padded.
  SuiteCase padded_random = make_case("padded_right_random_d64", CaseFamily::kStructure, "random",
                                      {2, 2, 2, 256, 256, 64}, CausalMode::kNone, ++seed);
  padded_random.spec.valid_keys = {256, 150};
  cases.push_back(padded_random);
  SuiteCase padded_sink = make_case("padded_left_sink_d64", CaseFamily::kSinkLike, "sink", {2, 2, 2, 256, 256, 64},
                                    CausalMode::kNone, ++seed);
  padded_sink.spec.valid_keys = {256, 97};
  padded_sink.spec.left_padded = true;
  padded_sink.spec.query_gain = 20.0;
  padded_sink.spec.key_offset_rms = 200.0;
  cases.push_back(padded_sink);
  return cases;
}

}  // namespace gaugewatch::testing
