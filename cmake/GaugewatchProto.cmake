# gaugewatch_add_proto_library(<target> PROTOS <files...> [GRPC] [IMPORT_ROOT <dir>])
#
# Runs protoc on each .proto (paths relative to IMPORT_ROOT, default the calling
# directory, so proto/gaugewatch/v1/types.proto is given as
# gaugewatch/v1/types.proto) and builds a static library of the generated code:
#   --cpp_out                       <name>.pb.h / <name>.pb.cc
#   with GRPC: --grpc_out + --plugin=protoc-gen-grpc=grpc_cpp_plugin
#                                   <name>.grpc.pb.h / <name>.grpc.pb.cc
# Consumers include "gaugewatch/v1/types.pb.h": the generated root is a PUBLIC
# (SYSTEM) include directory. The library links protobuf::libprotobuf and, with
# GRPC, gRPC::grpc++. Generated code is compiled with our warnings but without
# -Werror (it is not ours); it is position independent so shared libraries
# (the hooks) can link it.
#
# One explicit add_custom_command per .proto rather than protobuf_generate():
# on CMake 3.25 two protobuf_generate calls on one target lost the .grpc.pb.cc.
include_guard(GLOBAL)

function(gaugewatch_add_proto_library target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "GRPC" "IMPORT_ROOT" "PROTOS")
  if(ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "gaugewatch_add_proto_library(${target}): unknown arguments ${ARG_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT ARG_PROTOS)
    message(FATAL_ERROR "gaugewatch_add_proto_library(${target}): PROTOS <files...> is required")
  endif()
  if(NOT GAUGEWATCH_ENABLE_AGENT)
    message(FATAL_ERROR "gaugewatch_add_proto_library(${target}) needs GAUGEWATCH_ENABLE_AGENT=ON (protobuf/gRPC are found only then)")
  endif()
  if(NOT TARGET protobuf::libprotobuf OR NOT Protobuf_PROTOC_EXECUTABLE)
    message(FATAL_ERROR "gaugewatch_add_proto_library(${target}): protobuf was not found (GaugewatchDependencies.cmake)")
  endif()
  if(ARG_GRPC AND (NOT TARGET gRPC::grpc++ OR NOT GAUGEWATCH_GRPC_CPP_PLUGIN))
    message(FATAL_ERROR "gaugewatch_add_proto_library(${target}) GRPC: gRPC or grpc_cpp_plugin was not found")
  endif()

  if(ARG_IMPORT_ROOT)
    get_filename_component(_root "${ARG_IMPORT_ROOT}" ABSOLUTE BASE_DIR "${CMAKE_CURRENT_SOURCE_DIR}")
  else()
    set(_root "${CMAKE_CURRENT_SOURCE_DIR}")
  endif()
  set(_out "${CMAKE_CURRENT_BINARY_DIR}/${target}_generated")
  file(MAKE_DIRECTORY "${_out}")

  set(_protoc "${Protobuf_PROTOC_EXECUTABLE}")
  if(TARGET protobuf::protoc)
    set(_protoc protobuf::protoc)
  endif()

  set(_sources)
  set(_headers)
  set(_all_protos)
  foreach(_proto IN LISTS ARG_PROTOS)
    get_filename_component(_abs "${_proto}" ABSOLUTE BASE_DIR "${_root}")
    list(APPEND _all_protos "${_abs}")
  endforeach()

  foreach(_abs IN LISTS _all_protos)
    file(RELATIVE_PATH _rel "${_root}" "${_abs}")
    if(_rel MATCHES "^\\.\\./")
      message(FATAL_ERROR "gaugewatch_add_proto_library(${target}): ${_abs} is outside the import root ${_root}")
    endif()
    string(REGEX REPLACE "\\.proto$" "" _stem "${_rel}")
    set(_gen_src "${_out}/${_stem}.pb.cc")
    set(_gen_hdr "${_out}/${_stem}.pb.h")
    set(_outputs "${_gen_src}" "${_gen_hdr}")
    set(_args "--cpp_out=${_out}")
    if(ARG_GRPC)
      list(APPEND _outputs "${_out}/${_stem}.grpc.pb.cc" "${_out}/${_stem}.grpc.pb.h")
      list(APPEND _args
        "--grpc_out=${_out}"
        "--plugin=protoc-gen-grpc=${GAUGEWATCH_GRPC_CPP_PLUGIN}")
    endif()
    add_custom_command(
      OUTPUT ${_outputs}
      COMMAND ${_protoc} "--proto_path=${_root}" ${_args} "${_abs}"
      # A .proto can import any other of the library's .protos.
      DEPENDS ${_all_protos} ${_protoc}
      WORKING_DIRECTORY "${_root}"
      COMMENT "protoc ${_rel}"
      VERBATIM)
    foreach(_f IN LISTS _outputs)
      if(_f MATCHES "\\.cc$")
        list(APPEND _sources "${_f}")
      else()
        list(APPEND _headers "${_f}")
      endif()
    endforeach()
  endforeach()

  add_library(${target} STATIC ${_sources} ${_headers})
  target_include_directories(${target} SYSTEM PUBLIC "$<BUILD_INTERFACE:${_out}>")
  target_link_libraries(${target}
    PUBLIC protobuf::libprotobuf
    PRIVATE gaugewatch::warnings_relaxed)
  if(ARG_GRPC)
    target_link_libraries(${target} PUBLIC gRPC::grpc++)
  endif()
  set_target_properties(${target} PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    GAUGEWATCH_PROTO_GENERATED_DIR "${_out}")
endfunction()
