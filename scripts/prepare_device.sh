#!/usr/bin/env bash
# Run here, before sending work to the GPU machine (which reaches no package
# registry): puts what its build needs into the ignored third_party/ folder,
# which the device call carries:
#   third_party/cutlass/include   CUTLASS/CuTe headers (pinned wheel)
#   third_party/googletest        GoogleTest sources (from libgtest-dev)
# and the wheels the Python suite needs there into the ignored .whl/ folder:
# FLA 0.5.2 and HF transformers, pinned as in tests/python/requirements.txt (with
# the dependencies of transformers that the machine's own may be too old for), and
# FLA 0.6 (tests/python/requirements-fla-0.6.txt) in .whl/fla-0.6/.
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
rm -rf .whl
mkdir -p .whl/fla-0.6
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "$@"
}
download -d .whl fla-core==0.5.2 flash-linear-attention==0.5.2 einops transformers==5.17.0 \
  "huggingface-hub>=1.5,<2" "tokenizers>=0.23.1,<0.24" "safetensors>=0.8" "regex>=2025.10.22"
download -d .whl/fla-0.6 -r tests/python/requirements-fla-0.6.txt
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
echo "third_party/ ready: $(du -sh third_party | cut -f1); .whl/ ($(du -sh .whl | cut -f1)): $(ls .whl .whl/fla-0.6 | tr '\n' ' ')"
