// The process-wide runtime (runtime.h): configuration read and checked once,
// fork handlers, flush and the bounded shutdown at exit.
#include <dlfcn.h>
#include <pthread.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "hooks/log.h"
#include "hooks/runtime.h"

namespace gaugewatch::hooks {

using Clock = std::chrono::steady_clock;

namespace {
void shutdown_at_interpreter_exit() { runtime().shutdown(); }

// The CPython entry points the exit registration uses, found at run time
// (the hooks do not link libpython: the interpreter that loaded them has
// them); PyObject* is void* here. Resolved once, when the hooks register
// their exit handlers; `complete` is false when any is missing (then the
// Py_AtExit handler alone stops them).
struct PythonExitApi {
  int (*add_pending_call)(int (*)(void*), void*) = nullptr;
  void* (*save_thread)() = nullptr;
  void (*restore_thread)(void*) = nullptr;
  void (*incref)(void*) = nullptr;
  void (*decref)(void*) = nullptr;
  void* none = nullptr;
  void* (*import_module)(const char*) = nullptr;
  void* (*get_attr)(void*, const char*) = nullptr;
  void* (*new_function)(void*, void*, void*) = nullptr;
  void* (*call)(void*, ...) = nullptr;
  void (*clear_error)() = nullptr;
  bool complete = false;

  static PythonExitApi resolve() {
    PythonExitApi api;
    bool all = true;
    auto find = [&all](auto& slot, const char* name) {
      void* symbol = ::dlsym(RTLD_DEFAULT, name);
      all = all && symbol != nullptr;
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(symbol);
    };
    find(api.add_pending_call, "Py_AddPendingCall");
    find(api.save_thread, "PyEval_SaveThread");
    find(api.restore_thread, "PyEval_RestoreThread");
    find(api.incref, "Py_IncRef");
    find(api.decref, "Py_DecRef");
    find(api.none, "_Py_NoneStruct");
    find(api.import_module, "PyImport_ImportModule");
    find(api.get_attr, "PyObject_GetAttrString");
    find(api.new_function, "PyCFunction_NewEx");
    find(api.call, "PyObject_CallFunctionObjArgs");
    find(api.clear_error, "PyErr_Clear");
    api.complete = all;
    return api;
  }
};
PythonExitApi g_python;  // written once, before the pending call that reads it is queued

// CPython's PyMethodDef, for one METH_NOARGS function.
struct PythonMethod {
  const char* name;
  void* (*function)(void*, void*);
  int flags;
  const char* doc;
};
constexpr int kMethNoArgs = 0x0004;

// The Python atexit callback: the shutdown with the GIL released, so that
// the process's other threads (a process group's worker finishing its last
// work, which drops tensors that Python objects own) run while the hooks
// stop instead of meeting a finalizing interpreter, which ends a thread that
// asks for the GIL then (pthread_exit through C++ frames: std::terminate).
void* shutdown_at_python_exit(void* /*self*/, void* /*unused*/) {
  void* state = g_python.save_thread();
  runtime().shutdown();
  g_python.restore_thread(state);
  g_python.incref(g_python.none);
  return g_python.none;
}

PythonMethod g_exit_method{"gaugewatch_hooks_shutdown", &shutdown_at_python_exit, kMethNoArgs,
                           "Stops the gaugewatch hooks' threads and writes their stats file."};

// atexit.register(gaugewatch_hooks_shutdown), on the interpreter's main
// thread with the GIL held (a pending call). Failures leave the Py_AtExit
// handler to do the work. Always 0: no Python exception is left set.
int register_python_exit(void* /*arg*/) {
  const PythonExitApi& py = g_python;
  void* module = py.import_module("atexit");
  void* register_fn = module != nullptr ? py.get_attr(module, "register") : nullptr;
  void* function = register_fn != nullptr ? py.new_function(&g_exit_method, nullptr, nullptr) : nullptr;
  void* result = function != nullptr ? py.call(register_fn, function, nullptr) : nullptr;
  if (result == nullptr) {
    py.clear_error();
    log_line("could not register the hooks' Python exit handler: they stop at the end of the interpreter's exit");
  }
  for (void* object : {result, function, register_fn, module}) {
    if (object != nullptr) py.decref(object);
  }
  return 0;
}
}  // namespace

// In a Python process the shutdown runs from Python's atexit module, at the
// start of the interpreter's finalization, with the GIL released
// (shutdown_at_python_exit), and, as a fallback, at the end of it
// (Py_AtExit): either way before exit() runs any C exit handler or C++ static
// destructor, so the reporter's gRPC stream and the auditor's torch calls end
// while every library they use is intact, whatever the order in which those
// libraries registered their own teardown (gRPC constructs its statics
// lazily, after our std::atexit handler, so they are destroyed before it
// runs). The shutdown is idempotent: the later handlers find it done. At the
// end of the finalization alone, a DDP rank whose gloo worker thread released
// its last tensors while the hooks stopped aborted there (the thread asked for
// the GIL of a finalized interpreter; test_multi_rank, 3 of 17 runs,
// 2026-12-04). Called on the first backward, when the interpreter is running,
// possibly on an autograd thread: the atexit registration is a pending call
// that the main thread runs with the GIL, so nothing here waits for the GIL.
void Runtime::register_interpreter_exit() {
  using AtExit = int (*)(void (*)());
  using IsInitialized = int (*)();
  auto* at_exit = reinterpret_cast<AtExit>(::dlsym(RTLD_DEFAULT, "Py_AtExit"));
  auto* initialized = reinterpret_cast<IsInitialized>(::dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  if (at_exit == nullptr || initialized == nullptr || initialized() == 0) return;  // not Python: std::atexit only
  g_python = PythonExitApi::resolve();
  if (g_python.complete) {
    if (g_python.add_pending_call(&register_python_exit, nullptr) != 0) {
      log_line("the interpreter's pending-call queue is full: the hooks stop at the end of the interpreter's exit");
    }
  }
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
