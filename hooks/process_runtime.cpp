// The process-wide runtime (runtime.h): configuration read and checked once,
// fork handlers, flush and the bounded shutdown at exit.
#include <dlfcn.h>
#include <pthread.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "hooks/log.h"
#include "hooks/runtime.h"

namespace gaugewatch::hooks {

using Clock = std::chrono::steady_clock;

namespace {
void shutdown_at_interpreter_exit() { runtime().shutdown(); }
}  // namespace

// In a Python process the shutdown also runs at the end of the interpreter's
// finalization (Py_AtExit), before exit() runs any C exit handler or C++
// static destructor: the reporter's gRPC stream and the auditor's torch calls
// then end while every library they use is intact, whatever the order in
// which those libraries registered their own teardown (gRPC constructs its
// statics lazily, after our std::atexit handler, so they are destroyed before
// it runs). Called on the first backward, when the interpreter is running.
void Runtime::register_interpreter_exit() {
  using AtExit = int (*)(void (*)());
  using IsInitialized = int (*)();
  auto* at_exit = reinterpret_cast<AtExit>(::dlsym(RTLD_DEFAULT, "Py_AtExit"));
  auto* initialized = reinterpret_cast<IsInitialized>(::dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  if (at_exit == nullptr || initialized == nullptr || initialized() == 0) return;  // not Python: std::atexit only
  if (at_exit(&shutdown_at_interpreter_exit) != 0) {
    log_line("the interpreter's exit handler table is full: the hooks stop in the C exit handlers instead");
  }
}

void Runtime::prepare_fork() { mu_.lock(); }

void Runtime::after_fork_parent() { mu_.unlock(); }

void Runtime::after_fork_child() {
  // This thread took mu_ in prepare_fork() and is the child's only thread.
  forked_child_ = true;
  (void)reporter_.release();  // its threads are the parent's: leak it, never touch it
  shutdown_hooks_.clear();    // the auditor's thread is the parent's too
  audit_drain_ = nullptr;
  shut_down_ = true;          // exit: nothing to flush or join here
  sample_layers_.clear();
  capture_arms_.clear();
  mu_.unlock();
}

bool Runtime::forked_child() {
  std::lock_guard lock(mu_);
  return forked_child_;
}

bool Runtime::flush(double timeout_s) {
  Reporter* reporter = nullptr;
  std::function<bool(double)> drain;
  {
    std::lock_guard lock(mu_);
    reporter = reporter_.get();
    drain = audit_drain_;
  }
  const auto start = Clock::now();
  const bool drained = !drain || drain(timeout_s);
  const double left = std::max(0.0, timeout_s - std::chrono::duration<double>(Clock::now() - start).count());
  return (reporter == nullptr || reporter->flush(left)) && drained;
}

void Runtime::set_audit_drain(std::function<bool(double)> drain) {
  std::lock_guard lock(mu_);
  audit_drain_ = std::move(drain);
}

void Runtime::add_shutdown_hook(std::function<void()> hook) {
  std::lock_guard lock(mu_);
  shutdown_hooks_.push_back(std::move(hook));
}

void Runtime::shutdown() {
  std::vector<std::function<void()>> hooks;
  Reporter* reporter = nullptr;
  {
    std::lock_guard lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    hooks.swap(shutdown_hooks_);
    reporter = reporter_.get();
  }
  const auto t0 = Clock::now();
  for (auto& hook : hooks) hook();  // the auditor drains its queue (bounded)
  if (reporter != nullptr) {
    reporter->flush(1.5);
    reporter->stop(1.0);
  }
  {
    std::lock_guard lock(mu_);
    if (coverage_.total_calls() > 0 && !forked_child_) log_line("exit: " + coverage_.summary());
  }
  write_stats_file();
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (s > 0.5) log_line("exit: threads stopped in " + std::to_string(s).substr(0, 5) + " s");
}

namespace {
// Set once the runtime exists (the fork handlers run only after that).
Runtime* g_runtime_for_fork = nullptr;


}  // namespace

Runtime& runtime() {
  static Runtime* instance = [] {
    std::vector<std::string> warnings;
    HookConfig config = load_config([](const char* name) { return std::getenv(name); }, &warnings);
    std::string unwritable = set_log_file(config.log_file);
    for (const auto& w : warnings) log_line("config: " + w);
    if (unwritable.empty()) unwritable = check_stats_file(config.stats_file);
    if (!unwritable.empty() && !config.disabled) {
      log_line("ERROR: " + unwritable + ". The hooks stay inert: SDPA is not intercepted and this trainer runs "
               "unmonitored. Fix the path (or unset the variable) and restart.");
      config.disabled = true;
    }
    auto* r = new Runtime(std::move(config));
    std::atexit([] { runtime().shutdown(); });
    // A fork (DataLoader workers, os.fork) copies the state but not the
    // threads: the child turns monitoring off (runtime.h).
    ::pthread_atfork([] { g_runtime_for_fork->prepare_fork(); log_prepare_fork(); },
                     [] { log_after_fork(); g_runtime_for_fork->after_fork_parent(); },
                     [] {
                       log_after_fork();
                       g_runtime_for_fork->after_fork_child();
                       log_line("forked child: monitoring is off in this process (no samples, captures, agent "
                                "stream or stats file; the layers keep their backends)");
                     });
    g_runtime_for_fork = r;
    return r;
  }();
  return *instance;
}

}  // namespace gaugewatch::hooks
