#!/usr/bin/env bash
# Run here, before a GPU call that installs the Python package: builds
# flashqla's wheel (the core with its sm_90a kernels and the torch binding; one
# py3 wheel serves every Python 3, since torch loads the binding and the binding
# reads torch's CUDA stream at run time) into the ignored .whl/flashqla/, with a
# hash of the sources it came from. scripts/gpu.sh installs that wheel instead of
# building the package on the GPU machine when the hash matches the tree it runs
# in, and builds there otherwise (fq_install_flashqla). Carry .whl.
# Uses .venv (torch, as scripts/lib/python_env.sh sets it up) and the package's
# build folder build/python, reused from run to run. Run it after
# scripts/prepare_device.sh, which empties .whl/.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/build.sh"
source "${FLASHQLA_REPO_ROOT}/scripts/lib/python_env.sh"
source "${FLASHQLA_REPO_ROOT}/scripts/lib/gpu_common.sh"
cd "${FLASHQLA_REPO_ROOT}"
command -v nvcc >/dev/null 2>&1 || fq_die "nvcc not found: the wheel would have no CUDA backend"
[[ -d third_party/cutlass/include ]] || bash scripts/fetch_cutlass.sh
fq_python_with_torch
out=.whl/flashqla
rm -rf "${out}"
mkdir -p "${out}"
fq_log "building the wheel (FLASHQLA_JOBS=${FLASHQLA_JOBS})"
FLASHQLA_ENABLE_CUDA=1 FLASHQLA_JOBS="${FLASHQLA_JOBS}" \
  "${FLASHQLA_PYTHON}" -m pip wheel -q --no-deps --no-build-isolation -w "${out}" .
fq_source_hash > "${out}/SOURCE"
fq_log "$(ls "${out}"/*.whl) ($(du -h "${out}"/*.whl | cut -f1)), sources $(cat "${out}/SOURCE")"
