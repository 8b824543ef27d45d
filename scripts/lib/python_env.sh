# Python environment for the package and its tests. Source it; do not run it.
#
#   FLASHQLA_VENV         virtual environment folder (default: <repo>/.venv)
#   FLASHQLA_TORCH_SPEC   torch requirement installed when the venv has no torch
#                         (default: torch==2.11.0, the version on the GPU machine)

FLASHQLA_VENV="${FLASHQLA_VENV:-${FLASHQLA_REPO_ROOT}/.venv}"
FLASHQLA_TORCH_SPEC="${FLASHQLA_TORCH_SPEC:-torch==2.11.0}"
FLASHQLA_PYTHON="${FLASHQLA_VENV}/bin/python"

# Creates the venv if needed, installs torch (only when missing) and the test
# requirements, then builds and installs flashqla itself with `pip install .`.
fq_setup_python() {
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
  "${pip[@]}" install -q -r "${FLASHQLA_REPO_ROOT}/tests/python/requirements.txt"
  fq_log "pip install . (core + torch binding, built against $("${FLASHQLA_PYTHON}" -c 'import torch; print(torch.__version__)'))"
  "${pip[@]}" install -q "${FLASHQLA_REPO_ROOT}"
}
