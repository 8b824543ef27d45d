# Python environment for the package and its tests. Source it; do not run it.
#
#   FLASHQLA_VENV         virtual environment folder (default: <repo>/.venv)
#   FLASHQLA_TORCH_SPEC   torch requirement installed when the venv has no torch
#                         (default: torch==2.11.0, the version on the GPU machine)
#   FLASHQLA_FLA_NEXT_DIR folder holding FLA 0.6.x (tests/python/requirements-fla-0.6.txt),
#                         put first on PYTHONPATH for the suite's second FLA pass
#                         (default: <venv>/fla-0.6)

FLASHQLA_VENV="${FLASHQLA_VENV:-${FLASHQLA_REPO_ROOT}/.venv}"
FLASHQLA_TORCH_SPEC="${FLASHQLA_TORCH_SPEC:-torch==2.11.0}"
FLASHQLA_PYTHON="${FLASHQLA_VENV}/bin/python"
FLASHQLA_FLA_NEXT_DIR="${FLASHQLA_FLA_NEXT_DIR:-${FLASHQLA_VENV}/fla-0.6}"

# Creates the venv if needed and installs torch (only when missing).
fq_python_with_torch() {
  if [[ ! -x "${FLASHQLA_PYTHON}" ]]; then
    if ! python3 -c "import venv, ensurepip" >/dev/null 2>&1; then
      fq_log "installing python3-venv"
      apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv
    fi
    fq_log "creating ${FLASHQLA_VENV}"
    python3 -m venv "${FLASHQLA_VENV}"
  fi
  local pip=("${FLASHQLA_PYTHON}" -m pip --disable-pip-version-check)
  if ! "${FLASHQLA_PYTHON}" -c "import torch" >/dev/null 2>&1; then
    fq_log "installing ${FLASHQLA_TORCH_SPEC}"
    "${pip[@]}" install -q "${FLASHQLA_TORCH_SPEC}"
  fi
}

# fq_python_with_torch, then the test requirements, then builds and installs
# flashqla itself with `pip install .`.
fq_setup_python() {
  fq_python_with_torch
  local pip=("${FLASHQLA_PYTHON}" -m pip --disable-pip-version-check)
  "${pip[@]}" install -q -r "${FLASHQLA_REPO_ROOT}/tests/python/requirements.txt"
  local next_req="${FLASHQLA_REPO_ROOT}/tests/python/requirements-fla-0.6.txt"
  if ! cmp -s "${next_req}" "${FLASHQLA_FLA_NEXT_DIR}/requirements.txt"; then
    fq_log "installing FLA 0.6 into ${FLASHQLA_FLA_NEXT_DIR} (the suite's second FLA pass)"
    rm -rf "${FLASHQLA_FLA_NEXT_DIR}"
    "${pip[@]}" install -q --no-deps --target "${FLASHQLA_FLA_NEXT_DIR}" -r "${next_req}"
    cp "${next_req}" "${FLASHQLA_FLA_NEXT_DIR}/requirements.txt"
  fi
  fq_log "pip install . (core + torch binding, built against $("${FLASHQLA_PYTHON}" -c 'import torch; print(torch.__version__)'))"
  "${pip[@]}" install -q "${FLASHQLA_REPO_ROOT}"
}
