# Every third-party dependency, found once here; subdirectories only link the
# targets. A dependency that an enabled option needs and that is missing stops
# the configure step with the command that installs it.
#
#   always          Threads::Threads, nlohmann_json::nlohmann_json
#   TESTS           GTest::gtest GTest::gtest_main GTest::gmock GTest::gmock_main
#   AGENT           protobuf::libprotobuf protobuf::protoc gRPC::grpc++ absl::*
#                   yaml-cpp SQLite::SQLite3 gaugewatch::civetweb(_cpp) OpenSSL::SSL
#                   GAUGEWATCH_GRPC_CPP_PLUGIN (path), ZLIB::ZLIB
#   TORCH           gaugewatch::torch (see GaugewatchTorch.cmake)
#   CUDA            CUDA::cudart etc. (found in GaugewatchOptions.cmake)
#
# Searches honour CMAKE_PREFIX_PATH, so a prefix of unpacked .debs (the GPU
# machine, scripts/device.sh) works the same as /usr.
include_guard(GLOBAL)

# gaugewatch_missing_dependency(<what> <option or ""> <apt packages>)
function(gaugewatch_missing_dependency what option packages)
  if(option)
    set(_why "it is needed by ${option}=ON")
    set(_off "\n  or configure without it: -D${option}=OFF")
  else()
    set(_why "the core build needs it")
    set(_off "")
  endif()
  message(FATAL_ERROR
    "gaugewatch: ${what} was not found; ${_why}.\n"
    "Fix: sudo ./scripts/setup.sh\n"
    "  (or just this piece: sudo apt-get install -y ${packages})${_off}")
endfunction()

# --- always ------------------------------------------------------------------------
set(THREADS_PREFER_PTHREAD_FLAG ON)
find_package(Threads REQUIRED)

find_package(nlohmann_json 3 CONFIG QUIET)
if(NOT nlohmann_json_FOUND)
  gaugewatch_missing_dependency("nlohmann_json (JSON for Modern C++)" "" "nlohmann-json3-dev")
endif()

# CLI11: the `gaugewatch` launcher's flags.
if(NOT TARGET CLI11::CLI11)
  find_package(CLI11 CONFIG QUIET)
endif()
if(NOT TARGET CLI11::CLI11)
  gaugewatch_missing_dependency("CLI11" "" "libcli11-dev")
endif()

# --- tests -------------------------------------------------------------------------
if(GAUGEWATCH_ENABLE_TESTS)
  find_package(GTest QUIET)
  if(NOT GTest_FOUND OR NOT TARGET GTest::gtest_main)
    gaugewatch_missing_dependency("GoogleTest" GAUGEWATCH_ENABLE_TESTS "libgtest-dev libgmock-dev")
  endif()
  if(NOT TARGET GTest::gmock)
    gaugewatch_missing_dependency("GoogleMock (GTest::gmock)" GAUGEWATCH_ENABLE_TESTS "libgmock-dev")
  endif()
endif()

# --- agent: protobuf, gRPC, abseil, yaml-cpp, SQLite, civetweb, OpenSSL -------------
if(GAUGEWATCH_ENABLE_AGENT)
  find_package(Protobuf QUIET)
  if(NOT Protobuf_FOUND OR NOT Protobuf_PROTOC_EXECUTABLE)
    gaugewatch_missing_dependency("Protobuf (headers, library and protoc)" GAUGEWATCH_ENABLE_AGENT
      "libprotobuf-dev protobuf-compiler")
  endif()

  find_package(OpenSSL QUIET)
  if(NOT OpenSSL_FOUND)
    gaugewatch_missing_dependency("OpenSSL" GAUGEWATCH_ENABLE_AGENT "libssl-dev")
  endif()
  find_package(ZLIB QUIET)
  if(NOT ZLIB_FOUND)
    gaugewatch_missing_dependency("zlib" GAUGEWATCH_ENABLE_AGENT "zlib1g-dev")
  endif()

  find_package(absl CONFIG QUIET)
  if(NOT absl_FOUND)
    gaugewatch_missing_dependency("Abseil" GAUGEWATCH_ENABLE_AGENT "libabsl-dev")
  endif()

  # gRPC's config looks for RE2 through pkg-config, whose .pc files carry an
  # absolute prefix (breaks unpacked .debs) and which may not be installed.
  # Define re2::re2 from a plain library search first; gRPC then uses it.
  if(NOT TARGET re2::re2)
    find_package(re2 CONFIG QUIET)
  endif()
  if(NOT TARGET re2::re2)
    find_path(GAUGEWATCH_RE2_INCLUDE_DIR NAMES re2/re2.h)
    find_library(GAUGEWATCH_RE2_LIBRARY NAMES re2)
    if(GAUGEWATCH_RE2_INCLUDE_DIR AND GAUGEWATCH_RE2_LIBRARY)
      add_library(re2::re2 UNKNOWN IMPORTED)
      set_target_properties(re2::re2 PROPERTIES
        IMPORTED_LOCATION "${GAUGEWATCH_RE2_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${GAUGEWATCH_RE2_INCLUDE_DIR}")
    else()
      gaugewatch_missing_dependency("RE2 (needed by gRPC)" GAUGEWATCH_ENABLE_AGENT "libre2-dev")
    endif()
  endif()

  find_package(gRPC CONFIG QUIET)
  if(NOT gRPC_FOUND OR NOT TARGET gRPC::grpc++)
    gaugewatch_missing_dependency("gRPC C++ (CMake config gRPCConfig.cmake)" GAUGEWATCH_ENABLE_AGENT
      "libgrpc++-dev libgrpc-dev protobuf-compiler-grpc")
  endif()
  # The plugin protoc runs for --grpc_out: gRPC's own imported executable (so
  # a relocated prefix brings its own), else whatever grpc_cpp_plugin is on PATH.
  if(TARGET gRPC::grpc_cpp_plugin)
    set(GAUGEWATCH_GRPC_CPP_PLUGIN "$<TARGET_FILE:gRPC::grpc_cpp_plugin>")
  else()
    find_program(GAUGEWATCH_GRPC_CPP_PLUGIN grpc_cpp_plugin)
  endif()
  if(NOT GAUGEWATCH_GRPC_CPP_PLUGIN)
    gaugewatch_missing_dependency("grpc_cpp_plugin (protoc plugin)" GAUGEWATCH_ENABLE_AGENT "protobuf-compiler-grpc")
  endif()

  find_package(yaml-cpp CONFIG QUIET)
  if(NOT yaml-cpp_FOUND OR NOT TARGET yaml-cpp)
    gaugewatch_missing_dependency("yaml-cpp" GAUGEWATCH_ENABLE_AGENT "libyaml-cpp-dev")
  endif()

  find_package(SQLite3 QUIET)
  if(NOT SQLite3_FOUND)
    gaugewatch_missing_dependency("SQLite3" GAUGEWATCH_ENABLE_AGENT "libsqlite3-dev")
  endif()

  # civetweb serves /metrics and /healthz. Debian 12's CMake config for it is
  # broken (civetweb::server points at a missing /usr/bin/civetweb), so find
  # the header and libraries directly.
  find_path(GAUGEWATCH_CIVETWEB_INCLUDE_DIR NAMES civetweb.h)
  find_library(GAUGEWATCH_CIVETWEB_LIBRARY NAMES civetweb)
  find_library(GAUGEWATCH_CIVETWEB_CPP_LIBRARY NAMES civetweb-cpp)
  if(NOT GAUGEWATCH_CIVETWEB_INCLUDE_DIR OR NOT GAUGEWATCH_CIVETWEB_LIBRARY)
    gaugewatch_missing_dependency("civetweb (civetweb.h, libcivetweb)" GAUGEWATCH_ENABLE_AGENT "libcivetweb-dev")
  endif()
  add_library(gaugewatch::civetweb UNKNOWN IMPORTED)
  set_target_properties(gaugewatch::civetweb PROPERTIES
    IMPORTED_LOCATION "${GAUGEWATCH_CIVETWEB_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${GAUGEWATCH_CIVETWEB_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;${CMAKE_DL_LIBS}")
  if(GAUGEWATCH_CIVETWEB_CPP_LIBRARY)
    add_library(gaugewatch::civetweb_cpp UNKNOWN IMPORTED)
    set_target_properties(gaugewatch::civetweb_cpp PROPERTIES
      IMPORTED_LOCATION "${GAUGEWATCH_CIVETWEB_CPP_LIBRARY}"
      INTERFACE_LINK_LIBRARIES gaugewatch::civetweb)
  endif()
endif()

# --- torch -------------------------------------------------------------------------
if(GAUGEWATCH_ENABLE_TORCH)
  include(GaugewatchTorch)
endif()
