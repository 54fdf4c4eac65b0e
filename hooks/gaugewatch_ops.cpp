#include "hooks/gaugewatch_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <stdexcept>
#include <vector>

namespace gaugewatch::hooks {
namespace {

std::optional<c10::OperatorHandle> find(std::string_view op) {
  return c10::Dispatcher::singleton().findSchema({"gaugewatch::" + std::string(op), ""});
}

}  // namespace

std::string op_unavailable(std::string_view op) {
  return find(op) ? ""
                  : "gaugewatch::" + std::string(op) +
                        " is not registered (libgaugewatch_ops is not loaded, or is a version without it)";
}

bool op_takes(std::string_view op, std::string_view name) {
  const auto handle = find(op);
  if (!handle) return false;
  for (const c10::Argument& a : handle->schema().arguments()) {
    if (a.name() == name) return true;
  }
  return false;
}

c10::IValue call_op(std::string_view op, std::initializer_list<OpArgument> args) {
  const auto handle = find(op);
  if (!handle) throw std::runtime_error(op_unavailable(op));
  const auto& schema = handle->schema().arguments();
  for (const OpArgument& given : args) {
    bool known = false;
    for (const c10::Argument& a : schema) known = known || a.name() == given.first;
    if (!known && !given.second.isNone()) {
      throw std::runtime_error("the loaded gaugewatch::" + std::string(op) + " takes no argument '" +
                               std::string(given.first) + "' (an older libgaugewatch_ops)");
    }
  }
  std::vector<c10::IValue> stack;
  stack.reserve(schema.size());
  for (const c10::Argument& a : schema) {
    const OpArgument* value = nullptr;
    for (const OpArgument& given : args) {
      if (given.first == a.name()) value = &given;
    }
    if (value != nullptr) {
      stack.push_back(value->second);
    } else if (a.default_value().has_value()) {
      stack.push_back(*a.default_value());
    } else {
      throw std::runtime_error("gaugewatch::" + std::string(op) + " needs argument '" + a.name() + "'");
    }
  }
  handle->callBoxed(stack);
  if (stack.size() == 1) return std::move(stack[0]);
  return c10::ivalue::Tuple::create(std::move(stack));
}

Grads grads_of(const c10::IValue& result) {
  const auto& e = result.toTupleRef().elements();
  return {e.at(0).toTensor(), e.at(1).toTensor(), e.at(2).toTensor()};
}

}  // namespace gaugewatch::hooks
