#!/usr/bin/env bash
# Fetch the CUTLASS / CuTe headers the sm_90a kernels are built against.
#
# The headers come from the pinned `nvidia-cutlass` wheel on PyPI (it ships
# them under cutlass_library/source/include/). They are extracted into
# third_party/cutlass/include/{cute,cutlass}; nothing is committed to the
# repository. Re-running is a no-op once the pinned version is in place.
#
# Environment:
#   FLASHQLA_CUTLASS_VERSION  wheel version (default: the pinned one below)
#   FLASHQLA_CUTLASS_WHEEL    path to an already downloaded wheel (offline use)
set -euo pipefail

CUTLASS_VERSION="${FLASHQLA_CUTLASS_VERSION:-4.2.0.0}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${REPO_ROOT}/third_party/cutlass"
INCLUDE_DIR="${DEST}/include"
STAMP="${DEST}/.flashqla-cutlass-version"

if [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "nvidia-cutlass==${CUTLASS_VERSION}" \
      && -f "${INCLUDE_DIR}/cute/tensor.hpp" && -d "${INCLUDE_DIR}/cutlass" ]]; then
  echo "fetch_cutlass: nvidia-cutlass ${CUTLASS_VERSION} headers already in ${INCLUDE_DIR}"
  exit 0
fi

PYTHON="${PYTHON:-python3}"
TMP="$(mktemp -d)"
trap 'rm -rf "${TMP}"' EXIT

if [[ -n "${FLASHQLA_CUTLASS_WHEEL:-}" ]]; then
  WHEEL="${FLASHQLA_CUTLASS_WHEEL}"
else
  echo "fetch_cutlass: downloading nvidia-cutlass==${CUTLASS_VERSION} from PyPI"
  "${PYTHON}" -m pip download --quiet --no-deps --disable-pip-version-check \
    --only-binary=:all: --dest "${TMP}" "nvidia-cutlass==${CUTLASS_VERSION}"
  shopt -s nullglob
  wheels=("${TMP}"/nvidia_cutlass-*.whl)
  shopt -u nullglob
  if [[ ${#wheels[@]} -ne 1 ]]; then
    echo "fetch_cutlass: expected one nvidia_cutlass wheel in ${TMP}, found ${#wheels[@]}" >&2
    exit 1
  fi
  WHEEL="${wheels[0]}"
fi

# Extract into a staging folder first, then swap it in, so an interrupted run
# never leaves a half-populated include tree behind a valid stamp.
STAGE="${TMP}/stage"
"${PYTHON}" - "${WHEEL}" "${STAGE}" <<'PY'
import os
import sys
import zipfile

wheel, stage = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
wanted = ("cute/", "cutlass/")
count = 0
with zipfile.ZipFile(wheel) as zf:
    for info in zf.infolist():
        name = info.filename
        if not name.startswith(prefix) or info.is_dir():
            continue
        rel = name[len(prefix):]
        if not rel.startswith(wanted):
            continue
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise SystemExit(f"fetch_cutlass: unsafe path in wheel: {name}")
        target = os.path.join(stage, *parts)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with zf.open(info) as src, open(target, "wb") as dst:
            dst.write(src.read())
        count += 1
if not os.path.isfile(os.path.join(stage, "cute", "tensor.hpp")):
    raise SystemExit("fetch_cutlass: cute/tensor.hpp not found in the wheel")
print(f"fetch_cutlass: extracted {count} headers")
PY

rm -rf "${INCLUDE_DIR}"
mkdir -p "${DEST}"
mv "${STAGE}" "${INCLUDE_DIR}"
echo "nvidia-cutlass==${CUTLASS_VERSION}" > "${STAMP}"
echo "fetch_cutlass: CUTLASS headers in ${INCLUDE_DIR}"
