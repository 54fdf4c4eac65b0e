/* libgaugewatch_preload.so: what `gaugewatch run` puts in LD_PRELOAD.
 *
 * LD_PRELOAD is inherited by every program a trainer starts: the compilers
 * that Inductor and Triton run for each kernel, shells, tools. Preloading
 * libgaugewatch_hooks.so itself maps libtorch (and, in a CUDA build, its CUDA
 * libraries) into each of them, about a second per process on a CPU build
 * and more with CUDA, and multiplies the time of a torch.compile run. This
 * shim needs libc alone: in a Python interpreter it loads the hooks library
 * (RTLD_GLOBAL, as the preload would), anywhere else it does nothing.
 *
 * The hooks library: libgaugewatch_hooks.so beside this file (gaugewatch run
 * preloads the shim beside the hooks library it uses). A Python interpreter is a process
 * with Py_BytesMain in its initial link map (the interpreter executable or its
 * libpython). A failed load is reported on stderr and the process runs on
 * unmonitored: the shim never stops a program. docs/hooks.md, "Loading".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

static const char kHooksName[] = "libgaugewatch_hooks.so";

/* The hooks library beside this shim; 0 when its path does not fit. */
static int sibling_library(char* out, size_t size) {
  Dl_info info;
  if (dladdr((void*)&sibling_library, &info) == 0 || info.dli_fname == NULL) return 0;
  const char* slash = strrchr(info.dli_fname, '/');
  const size_t dir = slash == NULL ? 0 : (size_t)(slash - info.dli_fname + 1);
  if (dir + sizeof kHooksName > size) return 0;
  memcpy(out, info.dli_fname, dir);
  memcpy(out + dir, kHooksName, sizeof kHooksName);
  return 1;
}

__attribute__((constructor)) static void gaugewatch_preload(void) {
  if (dlsym(RTLD_DEFAULT, "Py_BytesMain") == NULL) return; /* not a Python interpreter */
  char path[PATH_MAX];
  if (!sibling_library(path, sizeof path)) {
    fprintf(stderr, "gaugewatch: cannot locate %s beside the preload shim (path too long); this process runs "
                    "unmonitored\n", kHooksName);
    return;
  }
  if (dlopen(path, RTLD_NOW | RTLD_GLOBAL) == NULL) {
    const char* why = dlerror();
    fprintf(stderr, "gaugewatch: cannot load the hooks library %s (%s); this process runs unmonitored\n", path,
            why == NULL ? "unknown error" : why);
  }
}
