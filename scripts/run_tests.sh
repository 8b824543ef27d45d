#!/usr/bin/env bash
# Set up and run the tests: installs missing prerequisites, fetches the CUTLASS
# headers when nvcc is available, configures and builds build/, runs the whole
# ctest suite (GoogleTest cases and the find_package consumer check), then sets
# up .venv (torch, test requirements, `pip install .`) and runs the Python suite.
# GPU-only test cases skip themselves on a machine without a GPU.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/build.sh"

start=${SECONDS}

source "${FLASHQLA_REPO_ROOT}/scripts/lib/python_env.sh"

# The Python suite runs on the CPU backend here; its GPU tests (marked gpu) run
# wherever CUDA exists and skip only where it does not. Its FLA and HF transformers
# tests then run a second time with FLA 0.6 in place of the venv's FLA 0.5.2.
run_python_tests() {
  fq_setup_python
  fq_log "running pytest"
  (cd "${FLASHQLA_REPO_ROOT}" && "${FLASHQLA_PYTHON}" -m pytest -q tests/python)
  fq_log "running pytest's FLA and transformers tests with FLA 0.6 (${FLASHQLA_FLA_NEXT_DIR})"
  (cd "${FLASHQLA_REPO_ROOT}" && PYTHONPATH="${FLASHQLA_FLA_NEXT_DIR}${PYTHONPATH:+:${PYTHONPATH}}" \
    "${FLASHQLA_PYTHON}" -m pytest -q -m "fla or transformers" tests/python)
}

fq_setup_and_build

fq_log "running ctest"
ctest --test-dir "${FLASHQLA_BUILD_DIR}" --output-on-failure -j "${FLASHQLA_JOBS}"

run_python_tests

fq_log "all tests passed in $((SECONDS - start)) s"
