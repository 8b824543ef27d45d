# ctest driver for the `cmake_consumer` test (run with cmake -P):
#   1. install the already-built flashqla into a fresh prefix,
#   2. configure tests/consumer against it with CMAKE_PREFIX_PATH,
#   3. build it,
#   4. run it and check its output.
# Any failing step fails the test and prints that step's output.
#
# Inputs (-D): FLASHQLA_BUILD_DIR, CONSUMER_SOURCE_DIR, WORK_DIR,
#              optional CONFIG, GENERATOR, C_COMPILER, EXPECTED_VERSION.
cmake_minimum_required(VERSION 3.24)

foreach(var FLASHQLA_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT CONFIG)
  set(CONFIG Release)
endif()

set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${prefix}" "${build}")
file(MAKE_DIRECTORY "${WORK_DIR}")

set(RUN_STEP_TEST cmake_consumer)
include("${CMAKE_CURRENT_LIST_DIR}/../cmake/run_step.cmake")

run_step(install
  "${CMAKE_COMMAND}" --install "${FLASHQLA_BUILD_DIR}" --prefix "${prefix}" --config "${CONFIG}")
message(STATUS "installed flashqla into ${prefix}")

set(configure_args -S "${CONSUMER_SOURCE_DIR}" -B "${build}"
  "-DCMAKE_PREFIX_PATH=${prefix}"
  "-DCMAKE_BUILD_TYPE=${CONFIG}"
  # Only the fresh prefix may satisfy find_package(flashqla).
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
  -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
if(GENERATOR)
  list(APPEND configure_args -G "${GENERATOR}")
endif()
if(C_COMPILER)
  list(APPEND configure_args "-DCMAKE_C_COMPILER=${C_COMPILER}")
endif()
if(EXPECTED_VERSION)
  list(APPEND configure_args "-DEXPECTED_FLASHQLA_VERSION=${EXPECTED_VERSION}")
endif()
run_step(configure "${CMAKE_COMMAND}" ${configure_args})
string(FIND "${step_output}" "flashqla_DIR=${prefix}/" found_in_prefix)
if(found_in_prefix EQUAL -1)
  message(FATAL_ERROR
    "cmake_consumer: flashqla was not found in the fresh prefix ${prefix}:\n${step_output}")
endif()
message(STATUS "configured the consumer against ${prefix}")

run_step(build "${CMAKE_COMMAND}" --build "${build}" --config "${CONFIG}")
message(STATUS "built the consumer")

set(exe "${build}/flashqla_consumer")
if(NOT EXISTS "${exe}" AND EXISTS "${build}/${CONFIG}/flashqla_consumer")
  set(exe "${build}/${CONFIG}/flashqla_consumer")
endif()
run_step(run "${exe}")
set(expected "flashqla consumer OK version ")
if(EXPECTED_VERSION)
  string(APPEND expected "${EXPECTED_VERSION}")
endif()
string(FIND "${step_output}" "${expected}" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR
    "cmake_consumer: the program exited 0 but did not print '${expected}':\n${step_output}")
endif()
message(STATUS "consumer output: ${step_output}")
