# flashqla_filter_ptxas_advisories(<target>)
#
# Runs the CUDA compiles of <target> through cmake/filter_ptxas_advisories.sh,
# which drops the two known-benign ptxas advisories (C7517 of the fused forward
# kernel, C7519 of the test-only wgmma layout cases; the script says why they
# are benign) and passes every other line and the compiler's exit status on.
# A compiler launcher is a target property that the Makefile and Ninja
# generators both honour, and it travels with the target into every build of it
# (scripts, `pip install .`). A launcher already given through
# CMAKE_CUDA_COMPILER_LAUNCHER (ccache, ...) still runs, after the filter.
# FLASHQLA_SHOW_PTXAS_ADVISORIES=ON leaves the targets as they are.
function(flashqla_filter_ptxas_advisories target)
  if(FLASHQLA_SHOW_PTXAS_ADVISORIES)
    return()
  endif()
  find_program(FLASHQLA_BASH bash)
  mark_as_advanced(FLASHQLA_BASH)
  if(NOT FLASHQLA_BASH)
    message(STATUS "flashqla: bash not found: the benign ptxas advisories C7517/C7519 are not filtered")
    return()
  endif()
  get_target_property(launcher ${target} CUDA_COMPILER_LAUNCHER)
  if(NOT launcher)
    set(launcher "")
  endif()
  set_property(TARGET ${target} PROPERTY CUDA_COMPILER_LAUNCHER
    "${FLASHQLA_BASH}" "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/filter_ptxas_advisories.sh" ${launcher})
  message(STATUS "flashqla: the known-benign ptxas advisories C7517/C7519 are filtered from "
    "the CUDA compiles of ${target} (-DFLASHQLA_SHOW_PTXAS_ADVISORIES=ON shows them)")
endfunction()
