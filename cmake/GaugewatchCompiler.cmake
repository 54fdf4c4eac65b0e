# INTERFACE targets that carry compile settings; nothing here is global.
#
#   gaugewatch::includes         the repo root as include root ("kernels/reference/bf16.h")
#   gaugewatch::warnings         project warnings + -Werror, for project code only
#   gaugewatch::warnings_relaxed the same warnings without -Werror (generated code)
#   gaugewatch::native_cpu       -march=native (C++ sources) when GAUGEWATCH_NATIVE_CPU
#   gaugewatch::fuzzer           -fsanitize=fuzzer,address,undefined (GAUGEWATCH_ENABLE_FUZZ)
include_guard(GLOBAL)
include(CheckCXXCompilerFlag)

# --- include root ---------------------------------------------------------------
add_library(gaugewatch_includes INTERFACE)
add_library(gaugewatch::includes ALIAS gaugewatch_includes)
target_include_directories(gaugewatch_includes INTERFACE
  "$<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>")
target_compile_features(gaugewatch_includes INTERFACE cxx_std_20)

# --- warnings -------------------------------------------------------------------
set(GAUGEWATCH_CXX_WARNINGS
  -Wall -Wextra -Wpedantic
  -Wshadow -Wnon-virtual-dtor -Woverloaded-virtual
  -Wformat=2 -Wimplicit-fallthrough -Wcast-qual -Wundef)
# Host-compiler warnings for .cu files, passed through nvcc with -Xcompiler.
# -Wpedantic is left out: nvcc's generated host code uses GCC line markers
# ("style of line directive is a GCC extension").
set(GAUGEWATCH_CUDA_HOST_WARNINGS
  -Wall -Wextra -Wshadow -Wnon-virtual-dtor -Wformat=2 -Wimplicit-fallthrough)
# GCC 12/13 at -O2/-O3 report -Wrestrict inside libstdc++ for `"literal" +
# std::string&&` (GCC bugs 105329 and 105651, false positives in <string>).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 14)
  list(APPEND GAUGEWATCH_CXX_WARNINGS -Wno-restrict)
  list(APPEND GAUGEWATCH_CUDA_HOST_WARNINGS -Wno-restrict)
endif()
# GCC 13 (the GPU machine's Ubuntu 24.04) adds -Wdangling-reference to -Wall,
# with false positives on functions returning references (GCC bug 107532).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 13
   AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 14)
  list(APPEND GAUGEWATCH_CXX_WARNINGS -Wno-dangling-reference)
  list(APPEND GAUGEWATCH_CUDA_HOST_WARNINGS -Wno-dangling-reference)
endif()
# GCC 13 at -O3 reports -Warray-bounds and -Wstringop-overflow inside
# libstdc++'s vector copy (stl_algobase.h memmove into "a region of size 8",
# GCC bugs 107852 and 106199) for code that copies small vectors.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 13
   AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 14)
  list(APPEND GAUGEWATCH_CXX_WARNINGS -Wno-array-bounds -Wno-stringop-overflow)
  list(APPEND GAUGEWATCH_CUDA_HOST_WARNINGS -Wno-array-bounds -Wno-stringop-overflow)
endif()
list(JOIN GAUGEWATCH_CUDA_HOST_WARNINGS "," _gw_cuda_host_warnings)

add_library(gaugewatch_warnings_relaxed INTERFACE)
add_library(gaugewatch::warnings_relaxed ALIAS gaugewatch_warnings_relaxed)
target_compile_options(gaugewatch_warnings_relaxed INTERFACE
  "$<$<COMPILE_LANGUAGE:CXX>:${GAUGEWATCH_CXX_WARNINGS}>"
  "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_gw_cuda_host_warnings}>")

add_library(gaugewatch_warnings INTERFACE)
add_library(gaugewatch::warnings ALIAS gaugewatch_warnings)
target_link_libraries(gaugewatch_warnings INTERFACE gaugewatch_warnings_relaxed)
if(GAUGEWATCH_WARNINGS_AS_ERRORS)
  target_compile_options(gaugewatch_warnings INTERFACE
    "$<$<COMPILE_LANGUAGE:CXX>:-Werror>"
    # nvcc's own diagnostics (-Werror all-warnings) and the host compiler's.
    "$<$<COMPILE_LANGUAGE:CUDA>:SHELL:-Werror all-warnings>"
    "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>")
endif()

# --- -march=native for the CPU reference -------------------------------------------
add_library(gaugewatch_native_cpu INTERFACE)
add_library(gaugewatch::native_cpu ALIAS gaugewatch_native_cpu)
if(GAUGEWATCH_NATIVE_CPU)
  check_cxx_compiler_flag(-march=native GAUGEWATCH_HAVE_MARCH_NATIVE)
  if(GAUGEWATCH_HAVE_MARCH_NATIVE)
    target_compile_options(gaugewatch_native_cpu INTERFACE
      "$<$<COMPILE_LANGUAGE:CXX>:-march=native>")
  else()
    message(WARNING "GAUGEWATCH_NATIVE_CPU=ON but ${CMAKE_CXX_COMPILER_ID} rejects -march=native; building without it")
  endif()
endif()

# --- libFuzzer ----------------------------------------------------------------------
add_library(gaugewatch_fuzzer INTERFACE)
add_library(gaugewatch::fuzzer ALIAS gaugewatch_fuzzer)
if(GAUGEWATCH_ENABLE_FUZZ)
  set(_gw_fuzz_flags -fsanitize=fuzzer,address,undefined -fno-omit-frame-pointer -g)
  target_compile_options(gaugewatch_fuzzer INTERFACE "$<$<COMPILE_LANGUAGE:CXX>:${_gw_fuzz_flags}>")
  target_link_options(gaugewatch_fuzzer INTERFACE ${_gw_fuzz_flags})
endif()

# --- Shared libraries loaded into Python processes ----------------------------------
# gaugewatch::shared_libstdcxx binds libstdc++ to the shared libstdc++.so.6 that
# the trainer process (Python, torch) already has. Some toolchains find only a
# libstdc++.a on a library path that CMake adds (the GPU image's GCC 13 does:
# /usr/lib/gcc/x86_64-linux-gnu/13 has no libstdc++.so) and link a private
# copy into the .so; a torch process then has two libstdc++ copies and the
# ops library crashed in std::ostream (seen 2026-11-29). Listed before the
# implicit -lstdc++, -l:libstdc++.so.6 resolves every std:: symbol first.
add_library(gaugewatch_shared_libstdcxx INTERFACE)
add_library(gaugewatch::shared_libstdcxx ALIAS gaugewatch_shared_libstdcxx)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
  target_link_libraries(gaugewatch_shared_libstdcxx INTERFACE
    "-Wl,--push-state,--no-as-needed" "-l:libstdc++.so.6" "-Wl,--pop-state")
endif()
