#pragma once
// C++ API of libgaugewatch_hooks for libtorch trainers. Linking the library
// (or loading it) is enough for zero-change monitoring: every SDPA attention
// call is intercepted and layers are named attn.0, attn.1, ... in call order.
// This header adds module names and explicit pass boundaries:
//
//   #include "hooks/gaugewatch_hooks.h"
//   for (auto& batch : data) {
//     gaugewatch::hooks::begin_pass();              // optional
//     for (int l = 0; l < layers; ++l) {
//       gaugewatch::hooks::LayerScope scope("blocks." + std::to_string(l) + ".attn");
//       ... at::scaled_dot_product_attention(q, k, v, {}, 0.0, true) ...
//     }
//     loss.backward(); optimizer.step();
//     gaugewatch::hooks::end_step();                // optional: steps = optimizer steps
//   }
//
// Configuration: GAUGEWATCH_* environment variables (docs/hooks.md), read at
// the first call. Nothing here throws.

#include <string>
#include <string_view>
#include <vector>

namespace gaugewatch::hooks {

// Marks the start of a forward pass (the next attention call starts a pass).
void begin_pass();
// Names the attention calls made until the matching exit_layer().
void enter_layer(std::string_view name);
void exit_layer(std::string_view name);

class LayerScope {
 public:
  explicit LayerScope(std::string name) : name_(std::move(name)) { enter_layer(name_); }
  ~LayerScope() { exit_layer(name_); }
  LayerScope(const LayerScope&) = delete;
  LayerScope& operator=(const LayerScope&) = delete;

 private:
  std::string name_;
};

// Marks an optimizer step: from the first call on, the step number counts
// optimizer steps (advancing at the next pass boundary) instead of backward
// passes, so gradient accumulation's micro-batches are one step. The Python
// helper calls it from a global optimizer step hook.
void end_step();
// Counts optimizer steps from the start (before the first end_step()).
void use_optimizer_steps();

// Layers, backends, backward counts per backend, sampler and reporter
// counters, as JSON (docs/hooks.md describes the fields).
std::string stats_json();
std::vector<std::string> layer_names();
// Waits until the audits of calls made so far have run and their samples and
// the acks reached the agent (or timeout_s passed: false).
bool flush(double timeout_s);

}  // namespace gaugewatch::hooks
