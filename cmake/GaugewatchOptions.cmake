# Build options and CUDA language detection.
#
# GAUGEWATCH_ENABLE_CUDA defaults to ON when check_language(CUDA) finds nvcc, so
# CI (no GPU, but nvcc installed) compiles every kernel. Kernels target sm_90a
# (Hopper with wgmma/setmaxnreg): nvcc gets -gencode=arch=compute_90a,code=sm_90a.
include_guard(GLOBAL)
include(CheckLanguage)

# nvcc is often installed at /usr/local/cuda without being on PATH.
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
   AND EXISTS "/usr/local/cuda/bin/nvcc")
  find_program(_gw_nvcc nvcc)
  if(NOT _gw_nvcc)
    set(CMAKE_CUDA_COMPILER "/usr/local/cuda/bin/nvcc" CACHE FILEPATH "CUDA compiler")
  endif()
  unset(_gw_nvcc CACHE)
endif()
check_language(CUDA)
if(CMAKE_CUDA_COMPILER)
  set(_gw_cuda_default ON)
else()
  set(_gw_cuda_default OFF)
endif()

option(GAUGEWATCH_ENABLE_CUDA  "Build the CUDA (sm_90a) kernels"             ${_gw_cuda_default})
option(GAUGEWATCH_ENABLE_TORCH "Build the libtorch ops and the hooks library" ON)
option(GAUGEWATCH_ENABLE_AGENT "Build the proto library, agent and ctl (gRPC)" ON)
option(GAUGEWATCH_ENABLE_TESTS "Build the GoogleTest suites and register them with ctest" ON)
option(GAUGEWATCH_ENABLE_BENCH "Build the compiled benchmarks (bench/agent load generator; needs GAUGEWATCH_ENABLE_AGENT)" ON)
option(GAUGEWATCH_ENABLE_FUZZ  "Build libFuzzer targets (needs clang)"        OFF)
option(GAUGEWATCH_NATIVE_CPU   "Compile the CPU reference with -march=native" ON)
option(GAUGEWATCH_WARNINGS_AS_ERRORS "Add -Werror to gaugewatch::warnings"   ON)
set(GAUGEWATCH_CUDA_ARCHITECTURES "90a-real" CACHE STRING
    "CMAKE_CUDA_ARCHITECTURES for the kernels (90a-real = -gencode=arch=compute_90a,code=sm_90a)")

if(GAUGEWATCH_ENABLE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR
      "GAUGEWATCH_ENABLE_CUDA=ON but no CUDA compiler (nvcc) was found.\n"
      "Fix: install the CUDA toolkit (nvcc at /usr/local/cuda/bin), or pass "
      "-DCMAKE_CUDA_COMPILER=/path/to/nvcc, or configure with -DGAUGEWATCH_ENABLE_CUDA=OFF.")
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "${GAUGEWATCH_CUDA_ARCHITECTURES}")
  endif()
  enable_language(CUDA)
  # CMake 3.25 knows no C++20 flag for nvcc (added in later CMake); nvcc >= 12
  # accepts -std=c++20. Teach it here so CUDA_STANDARD 20 works on 3.25 and 4.x.
  if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION
     AND CMAKE_CUDA_COMPILER_ID STREQUAL "NVIDIA"
     AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  find_package(CUDAToolkit REQUIRED)
endif()

# The only compiled benchmark is the agent's load generator (bench/agent, added
# by agent/CMakeLists.txt); the Python benchmarks under bench/ need no option.
if(GAUGEWATCH_ENABLE_BENCH AND NOT GAUGEWATCH_ENABLE_AGENT)
  message(STATUS "GAUGEWATCH_ENABLE_BENCH: no benchmark to build without GAUGEWATCH_ENABLE_AGENT=ON (bench/agent)")
endif()

if(GAUGEWATCH_ENABLE_FUZZ AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR
    "GAUGEWATCH_ENABLE_FUZZ=ON needs clang (libFuzzer); the C++ compiler is "
    "${CMAKE_CXX_COMPILER_ID}.\nFix: sudo ./scripts/setup.sh (installs clang and "
    "libclang-rt-14-dev), then configure a separate build dir with "
    "CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DGAUGEWATCH_ENABLE_FUZZ=ON")
endif()

# Summary printed at the end of the top-level CMakeLists.txt.
function(gaugewatch_print_summary)
  message(STATUS "")
  message(STATUS "gaugewatch ${PROJECT_VERSION} (${CMAKE_BUILD_TYPE}), ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}")
  foreach(_opt CUDA TORCH AGENT TESTS BENCH FUZZ)
    message(STATUS "  GAUGEWATCH_ENABLE_${_opt} = ${GAUGEWATCH_ENABLE_${_opt}}")
  endforeach()
  message(STATUS "  GAUGEWATCH_NATIVE_CPU   = ${GAUGEWATCH_NATIVE_CPU}")
  if(GAUGEWATCH_ENABLE_CUDA)
    message(STATUS "  CUDA: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
  endif()
  if(GAUGEWATCH_ENABLE_TORCH)
    message(STATUS "  torch: ${GAUGEWATCH_TORCH_VERSION} (${GAUGEWATCH_PYTHON}), lib ${GAUGEWATCH_TORCH_LIB_DIR}")
  endif()
  message(STATUS "")
endfunction()
