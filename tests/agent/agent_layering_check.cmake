# Fails when agent/state, agent/rules or agent/export includes agent/server:
# the run state, the rules and the exposition sit below the transport and
# the controller, which use them (docs/agent.md).
# Run: cmake -DAGENT_DIR=<repo>/agent -P agent_layering_check.cmake
set(_violations "")
foreach(_layer IN ITEMS state rules export)
  file(GLOB_RECURSE _files "${AGENT_DIR}/${_layer}/*.h" "${AGENT_DIR}/${_layer}/*.cpp")
  foreach(_file IN LISTS _files)
    file(STRINGS "${_file}" _includes REGEX "^#include \"agent/server/")
    foreach(_line IN LISTS _includes)
      list(APPEND _violations "${_file}: ${_line}")
    endforeach()
  endforeach()
endforeach()
list(LENGTH _violations _count)
if(_count GREATER 0)
  list(JOIN _violations "\n  " _text)
  message(FATAL_ERROR "agent layering: ${_count} include(s) of agent/server from a lower layer:\n  ${_text}")
endif()
message(STATUS "agent layering: state/, rules/ and export/ include nothing from agent/server")
