#pragma once
// Named, seeded input generators for the audit: the four-key witness, random
// inputs, sink-like inputs (a large common key offset and sharp queries),
// common key translations, two-key rows, one massive key, two key clusters.
// Every operand is rounded to BF16, as a BF16 kernel receives it; a scenario
// also produces the saved forward through the fused BF16 forward emulation.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/reference/attention_problem.h"

namespace gaugewatch::audit {

struct ScenarioSpec {
  std::string kind = "random";  // see scenario_kinds()
  reference::AttentionShape shape{1, 2, 2, 256, 256, 64};
  reference::CausalMode causal = reference::CausalMode::kTopLeft;
  // Packed sequences: lengths of each segment along N and M (empty: dense).
  std::vector<int64_t> q_segments, k_segments;
  std::optional<double> scale;       // default 1 / sqrt(d)
  uint64_t seed = 1;
  double query_gain = 1.0;           // q = gain * N(0, 1)
  double query_offset_rms = 0.0;     // common query offset, per-coordinate RMS
  double key_offset_rms = 0.0;       // common key offset, per-coordinate RMS
  double massive_key_norm = 5000.0;  // "massive_key" only
  // Key padding as an attn_mask (B, 1, 1, M): keys that take part per batch
  // element (empty: no mask), at the end when left padded, else at the start.
  std::vector<int64_t> valid_keys;
  bool left_padded = false;
};

struct Scenario {
  std::string name;
  ScenarioSpec spec;
  std::string description;
};

// The scenarios `gaugewatch audit <name>` knows, with their defaults.
const std::vector<Scenario>& scenario_catalogue();
const Scenario* find_scenario(const std::string& name);
std::vector<std::string> scenario_kinds();

// Builds the operands of a spec (throws std::invalid_argument for bad specs).
reference::AttentionInputs make_inputs(const ScenarioSpec& spec);

// The four-key witness of docs/numerics.md, exactly: d = 64, alpha = 1/8, q = 0,
// keys sharing first coordinate 65536. Plain BF16 gives dq[0] = -24; truth 0.
reference::AttentionInputs four_key_witness();

}  // namespace gaugewatch::audit
