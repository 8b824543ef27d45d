# ctest driver for the `readme_c_snippet` test (run with cmake -P): README.md's
# C snippet must be working code, exactly as the README shows it.
#   1. extract the ```c block of the "## Using the C API" section of README.md
#      into <WORK_DIR>/readme_c_snippet.c (with a #line directive, so compiler
#      messages point at README.md's own lines),
#   2. compile and link it with c_snippet_driver.c (which includes it first, and
#      calls its run_gdn_forward on host buffers) against the built libflashqla,
#      warnings as errors,
#   3. run it: the CPU backend must succeed and write finite outputs.
# Any failing step fails the test and prints that step's output.
#
# Inputs (-D): README, DRIVER, WORK_DIR, C_COMPILER, INCLUDE_DIR, LIBRARY
#              (the built libflashqla file).
cmake_minimum_required(VERSION 3.24)

foreach(var README DRIVER WORK_DIR C_COMPILER INCLUDE_DIR LIBRARY)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_c_snippet.cmake: -D${var}=... is required")
  endif()
endforeach()

# --- 1. extract ------------------------------------------------------------------
set(heading "## Using the C API")
file(READ "${README}" readme)
string(FIND "${readme}" "\n${heading}\n" section_begin)
if(section_begin EQUAL -1)
  message(FATAL_ERROR "readme_c_snippet: no '${heading}' section in ${README}")
endif()
math(EXPR section_begin "${section_begin} + 1")
string(SUBSTRING "${readme}" ${section_begin} -1 section)
# The section ends at the next heading of the same or a higher level.
string(LENGTH "${heading}" heading_length)
string(SUBSTRING "${section}" ${heading_length} -1 after_heading)
string(REGEX MATCH "\n#?# " next_heading "${after_heading}")
if(next_heading)
  string(FIND "${after_heading}" "${next_heading}" section_end)
  string(SUBSTRING "${after_heading}" 0 ${section_end} after_heading)
endif()

set(fence_open "\n```c\n")
string(FIND "${after_heading}" "${fence_open}" code_begin)
if(code_begin EQUAL -1)
  message(FATAL_ERROR "readme_c_snippet: no ```c block in the '${heading}' section of ${README}")
endif()
string(LENGTH "${fence_open}" fence_length)
math(EXPR code_begin "${code_begin} + ${fence_length}")
string(SUBSTRING "${after_heading}" ${code_begin} -1 code)
string(FIND "${code}" "\n```\n" code_end)
if(code_end EQUAL -1)
  message(FATAL_ERROR "readme_c_snippet: the ```c block of '${heading}' in ${README} is not closed")
endif()
math(EXPR code_end "${code_end} + 1")  # keep the last line's newline
string(SUBSTRING "${code}" 0 ${code_end} code)

# README.md's line number of the snippet's first line, for #line.
math(EXPR offset "${section_begin} + ${heading_length} + ${code_begin}")
string(SUBSTRING "${readme}" 0 ${offset} before)
string(REGEX MATCHALL "\n" newlines "${before}")
list(LENGTH newlines first_line)
math(EXPR first_line "${first_line} + 1")

file(MAKE_DIRECTORY "${WORK_DIR}")
set(snippet "${WORK_DIR}/readme_c_snippet.c")
file(WRITE "${snippet}" "#line ${first_line} \"${README}\"\n${code}")
string(REGEX MATCHALL "\n" code_lines "${code}")
list(LENGTH code_lines code_lines)
math(EXPR last_line "${first_line} + ${code_lines} - 1")
message(STATUS "extracted lines ${first_line}-${last_line} of ${README} into ${snippet}")

set(RUN_STEP_TEST readme_c_snippet)
include("${CMAKE_CURRENT_LIST_DIR}/../cmake/run_step.cmake")

# --- 2. compile and link ---------------------------------------------------------
set(exe "${WORK_DIR}/readme_c_snippet")
file(REMOVE "${exe}")
get_filename_component(library_dir "${LIBRARY}" DIRECTORY)
run_step(compile
  "${C_COMPILER}" -std=c99 -Wall -Wextra -Wpedantic -Werror
  "-I${INCLUDE_DIR}" "-I${WORK_DIR}"
  "${DRIVER}" "${LIBRARY}" "-Wl,-rpath,${library_dir}" -lm
  -o "${exe}")
message(STATUS "compiled and linked the snippet with ${DRIVER}")

# --- 3. run ----------------------------------------------------------------------
run_step(run "${exe}")
string(FIND "${step_output}" "readme C snippet OK" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR
    "readme_c_snippet: the program exited 0 but did not print 'readme C snippet OK':\n${step_output}")
endif()
message(STATUS "${step_output}")
