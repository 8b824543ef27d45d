#!/usr/bin/env bash
# On the GPU machine, for when device time is short: build and the C++ suite
# (scripts/gpu_check.sh --cpp-only), then, if it passed, the full forward
# benchmark (scripts/gpu_bench.sh, which also installs the package), then the
# Python GPU suite. The benchmark's h200.csv / h200.json (h100.* on an H100)
# and the logs go to $OUT as they are written, so a run cut short keeps what it
# measured. Needs third_party/ and .whl/ from scripts/prepare_device.sh, carried
# with the call.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-/tmp/flashqla-gpu-lean-run}"
mkdir -p "${out}"
logs=$(mktemp -d)
OUT="${logs}" bash scripts/gpu_check.sh --cpp-only || { tail -n 30 "${logs}/ctest.log"; exit 1; }
OUT="${out}" bash scripts/gpu_bench.sh "$@" > "${out}/bench.log" 2>&1
bench_rc=$?
tail -n 4 "${out}/bench.log"
python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/python > "${out}/pytest.log" 2>&1
pytest_rc=$?
grep -E "^(FAILED|ERROR|SKIPPED)" "${out}/pytest.log" | head -n 20
echo "pytest -m gpu (rc ${pytest_rc}): $(tail -n 1 "${out}/pytest.log")"
[[ ${bench_rc} -eq 0 && ${pytest_rc} -eq 0 ]]
