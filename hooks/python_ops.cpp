#include "hooks/python_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <string>
#include <vector>

#include "hooks/gaugewatch_hooks.h"

namespace gaugewatch::hooks {
namespace {

std::string stats_op() { return stats_json(); }
std::vector<std::string> layer_names_op() { return layer_names(); }
void begin_pass_op() { begin_pass(); }
void enter_layer_op(c10::string_view name) { enter_layer(name); }
void exit_layer_op(c10::string_view name) { exit_layer(name); }
bool flush_op(double timeout_s) { return flush(timeout_s); }
void optimizer_step_op() { end_step(); }
void use_optimizer_steps_op() { use_optimizer_steps(); }
bool active_op() { return true; }

}  // namespace

bool python_ops_registered() {
  return c10::Dispatcher::singleton().findSchema({"gaugewatch_hooks::stats", ""}).has_value();
}

void define_python_ops(torch::Library& defs) {
  defs.def("stats() -> str", &stats_op);
  defs.def("layer_names() -> str[]", &layer_names_op);
  defs.def("begin_pass() -> ()", &begin_pass_op);
  defs.def("enter_layer(str name) -> ()", &enter_layer_op);
  defs.def("exit_layer(str name) -> ()", &exit_layer_op);
  defs.def("flush(float timeout_s=5.0) -> bool", &flush_op);
  defs.def("active() -> bool", &active_op);
  defs.def("optimizer_step() -> ()", &optimizer_step_op);
  defs.def("use_optimizer_steps() -> ()", &use_optimizer_steps_op);
}

}  // namespace gaugewatch::hooks
