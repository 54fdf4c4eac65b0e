#pragma once
// Calls of the gaugewatch torch ops (libgaugewatch_ops, schemas in
// kernels/torch/registration.cpp) from the hooks: by argument name through
// the dispatcher, so each call names its arguments once and an argument the
// loaded library's schema does not have is refused clearly (an older
// library) instead of being passed in the wrong place.

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

namespace gaugewatch::hooks {

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using OpArgument = std::pair<std::string_view, c10::IValue>;

// Why gaugewatch::<op> cannot be called ("" when it can): not loaded.
std::string op_unavailable(std::string_view op);
// Whether gaugewatch::<op>'s schema has an argument `name`.
bool op_takes(std::string_view op, std::string_view name);

// gaugewatch::<op>(args...): arguments by schema name, defaults for the
// rest. Throws std::runtime_error when the op is not loaded or an argument
// with a value (not None) is not in its schema; the op's own errors as it
// throws them (c10::Error).
c10::IValue call_op(std::string_view op, std::initializer_list<OpArgument> args);

// The three gradients of attention_backward / attention_backward_rows.
Grads grads_of(const c10::IValue& result);

}  // namespace gaugewatch::hooks
