#!/usr/bin/env bash
# Run here, before sending work to the GPU machine (which reaches no package
# registry): puts what its build needs into the ignored third_party/ folder,
# which the device call carries:
#   third_party/cutlass/include   CUTLASS/CuTe headers (pinned wheel)
#   third_party/googletest        GoogleTest sources (from libgtest-dev)
# and the wheels the Python suite needs there into the ignored .whl/ folder
# (FLA, pinned as in tests/python/requirements.txt).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/fetch_cutlass.sh
src=/usr/src/googletest
if [[ ! -f "${src}/CMakeLists.txt" ]]; then
  echo "error: ${src} missing; apt-get install googletest" >&2
  exit 1
fi
rm -rf third_party/googletest
cp -r "${src}" third_party/googletest
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl fla-core==0.5.2 einops
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
echo "third_party/ ready: $(du -sh third_party | cut -f1); .whl/: $(ls .whl | tr '\n' ' ')"
