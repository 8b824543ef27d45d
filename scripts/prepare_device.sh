#!/usr/bin/env bash
# Run here, before sending work to the GPU machine (which reaches no package
# registry): puts what its build needs into the ignored third_party/ folder,
# which the device call carries:
#   third_party/cutlass/include   CUTLASS/CuTe headers (pinned wheel)
#   third_party/googletest        GoogleTest sources (from libgtest-dev)
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
echo "third_party/ ready: $(du -sh third_party | cut -f1)"
