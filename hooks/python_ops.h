#pragma once
// torch.ops.gaugewatch_hooks.*: the ops the Python helper
// (hooks/python/gaugewatch_hooks) calls: stats, layer_names, begin_pass,
// enter_layer, exit_layer, flush, active, optimizer_step, use_optimizer_steps.

#include <torch/library.h>

namespace gaugewatch::hooks {

// Whether a copy of the library already defined them in this process.
bool python_ops_registered();
void define_python_ops(torch::Library& defs);

}  // namespace gaugewatch::hooks
