# Shared by the cmake -P test drivers (tests/consumer/run_consumer.cmake,
# tests/readme/run_c_snippet.cmake). Set RUN_STEP_TEST to the test's name first.
#
# run_step(<name> <command>...): runs the command; on a non-zero exit fails the
# test with the command and its output. Leaves the output in step_output.
function(run_step name)
  execute_process(
    COMMAND ${ARGN}
    RESULT_VARIABLE rc
    OUTPUT_VARIABLE out
    ERROR_VARIABLE err)
  if(NOT rc STREQUAL "0")
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR
      "${RUN_STEP_TEST}: step '${name}' failed (exit ${rc})\n"
      "command: ${cmd}\n"
      "--- stdout ---\n${out}\n--- stderr ---\n${err}")
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()
