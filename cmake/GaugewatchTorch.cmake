# libtorch from the Python environment that will load our ops.
#
# GAUGEWATCH_PYTHON       the interpreter whose torch we build against
#                         (default: <repo>/.venv/bin/python if present, else python3;
#                          the GPU machine passes -DGAUGEWATCH_PYTHON=python3)
# Results:
#   gaugewatch::torch           INTERFACE target: libtorch (+ c10_cuda when torch has
#                               CUDA) and the nvcc flags torch headers need in .cu files
#   GAUGEWATCH_TORCH_VERSION    e.g. 2.11.0+cu130
#   GAUGEWATCH_TORCH_CUDA       torch.version.cuda ("" for a CPU-only torch)
#   GAUGEWATCH_TORCH_LIB_DIR    site-packages/torch/lib (RPATH of our shared libraries)
#   GAUGEWATCH_TORCH_CXX11_ABI  ON/OFF, torch._C._GLIBCXX_USE_CXX11_ABI
#
# find_package(Torch) runs inside a function: Caffe2's config rewrites
# CMAKE_CUDA_FLAGS (its own -gencode list and nvcc flags) and warns about
# CMAKE_CUDA_ARCHITECTURES; in a function scope none of that leaks into our
# CUDA targets, while the imported targets it creates stay visible.
include_guard(GLOBAL)

if(NOT GAUGEWATCH_PYTHON)
  if(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(_gw_py_default "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  else()
    find_program(_gw_py_default NAMES python3 python)
  endif()
  set(GAUGEWATCH_PYTHON "${_gw_py_default}" CACHE FILEPATH
      "Python interpreter whose torch the ops and hooks are built against")
  unset(_gw_py_default)
  unset(_gw_py_default CACHE)
endif()
if(NOT GAUGEWATCH_PYTHON)
  gaugewatch_missing_dependency("a Python interpreter (for torch)" GAUGEWATCH_ENABLE_TORCH "python3 python3-venv")
endif()

execute_process(
  COMMAND "${GAUGEWATCH_PYTHON}" -c
    "import os, torch; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(os.path.join(os.path.dirname(torch.__file__), 'lib')); print(torch.version.cuda or ''); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  RESULT_VARIABLE _gw_rc
  OUTPUT_VARIABLE _gw_out
  ERROR_VARIABLE _gw_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _gw_rc EQUAL 0)
  message(FATAL_ERROR
    "gaugewatch: '${GAUGEWATCH_PYTHON}' cannot import torch; GAUGEWATCH_ENABLE_TORCH=ON needs it.\n"
    "${_gw_err}\n"
    "Fix: sudo ./scripts/setup.sh   (creates .venv with torch==2.11.0)\n"
    "  or point at an interpreter that has torch: -DGAUGEWATCH_PYTHON=/path/to/python\n"
    "  or configure without it: -DGAUGEWATCH_ENABLE_TORCH=OFF")
endif()
string(REPLACE "\n" ";" _gw_out "${_gw_out}")
list(GET _gw_out 0 GAUGEWATCH_TORCH_CMAKE_PREFIX)
list(GET _gw_out 1 GAUGEWATCH_TORCH_VERSION)
list(GET _gw_out 2 GAUGEWATCH_TORCH_LIB_DIR)
list(LENGTH _gw_out _gw_n)
set(GAUGEWATCH_TORCH_CUDA "")
if(_gw_n EQUAL 5)
  list(GET _gw_out 3 GAUGEWATCH_TORCH_CUDA)
  list(GET _gw_out 4 _gw_abi)
else()
  list(GET _gw_out 3 _gw_abi)
endif()
if(_gw_abi)
  set(GAUGEWATCH_TORCH_CXX11_ABI ON)
else()
  set(GAUGEWATCH_TORCH_CXX11_ABI OFF)
endif()

function(_gaugewatch_find_torch)
  list(PREPEND CMAKE_PREFIX_PATH "${GAUGEWATCH_TORCH_CMAKE_PREFIX}")
  # torch's config runs find_package(Python): make it the same interpreter.
  set(Python_EXECUTABLE "${GAUGEWATCH_PYTHON}")
  unset(CMAKE_CUDA_ARCHITECTURES)
  # Our kernels are sm_90a; tell torch's config so that it neither probes for
  # a GPU nor emits a long default -gencode list (kept in this scope anyway).
  if(NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
    set(TORCH_CUDA_ARCH_LIST "9.0a")
  endif()
  # torch's CUDA config needs the toolkit; point it at nvcc when we know it.
  if(CMAKE_CUDA_COMPILER AND NOT DEFINED CUDAToolkit_ROOT)
    get_filename_component(_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    get_filename_component(CUDAToolkit_ROOT "${_bin}" DIRECTORY)
  endif()
  find_package(Torch QUIET)
  if(NOT Torch_FOUND AND NOT TORCH_FOUND)
    message(FATAL_ERROR
      "gaugewatch: find_package(Torch) failed for torch ${GAUGEWATCH_TORCH_VERSION} at "
      "${GAUGEWATCH_TORCH_CMAKE_PREFIX}.\n"
      "A CUDA build of torch (${GAUGEWATCH_TORCH_CUDA}) needs the CUDA toolkit (nvcc, "
      "/usr/local/cuda) at configure time.\n"
      "Fix: sudo ./scripts/setup.sh, or -DGAUGEWATCH_ENABLE_TORCH=OFF")
  endif()
  set(GAUGEWATCH_TORCH_LIBRARIES "${TORCH_LIBRARIES}" PARENT_SCOPE)
endfunction()
_gaugewatch_find_torch()

add_library(gaugewatch_torch INTERFACE)
add_library(gaugewatch::torch ALIAS gaugewatch_torch)
target_link_libraries(gaugewatch_torch INTERFACE ${GAUGEWATCH_TORCH_LIBRARIES})
# What torch's headers need in .cu files (Caffe2's config puts these in
# CMAKE_CUDA_FLAGS for its own builds).
target_compile_options(gaugewatch_torch INTERFACE
  "$<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr;--expt-extended-lambda>")
target_compile_definitions(gaugewatch_torch INTERFACE
  "_GLIBCXX_USE_CXX11_ABI=$<BOOL:${GAUGEWATCH_TORCH_CXX11_ABI}>")
