#include <string>

#include "hooks/gaugewatch_hooks.h"
#include "hooks/log.h"
#include "hooks/runtime.h"

namespace gaugewatch::hooks {

// Each entry point catches everything: nothing reaches the trainer.
void begin_pass() {
  try {
    runtime().begin_pass();
  } catch (const std::exception& e) {
    log_once("api-begin", e.what());
  }
}

void enter_layer(std::string_view name) {
  try {
    runtime().enter_layer(std::string(name));
  } catch (const std::exception& e) {
    log_once("api-enter", e.what());
  }
}

void exit_layer(std::string_view name) {
  try {
    runtime().exit_layer(std::string(name));
  } catch (const std::exception& e) {
    log_once("api-exit", e.what());
  }
}

void end_step() {
  try {
    runtime().optimizer_step();
  } catch (const std::exception& e) {
    log_once("api-end-step", e.what());
  }
}

void use_optimizer_steps() {
  try {
    runtime().use_optimizer_steps();
  } catch (const std::exception& e) {
    log_once("api-optimizer-steps", e.what());
  }
}

std::string stats_json() {
  try {
    return runtime().stats_json();
  } catch (const std::exception& e) {
    log_once("api-stats", e.what());
    return "{}";
  }
}

std::vector<std::string> layer_names() {
  try {
    return runtime().layer_names();
  } catch (const std::exception& e) {
    log_once("api-names", e.what());
    return {};
  }
}

bool flush(double timeout_s) {
  try {
    const bool flushed = runtime().flush(timeout_s);
    runtime().write_stats_file();
    return flushed;
  } catch (const std::exception& e) {
    log_once("api-flush", e.what());
    return false;
  }
}

}  // namespace gaugewatch::hooks
