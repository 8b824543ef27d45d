#!/usr/bin/env bash
# On the GPU machine: install the FLA wheels and the package into the machine's
# torch environment (no index needed), then run the forward benchmark over the
# rows of the published table (all rows, or those matching $1, a regular
# expression on "model,seqlens"). Writes h200.csv and h200.json to $OUT (or
# benchmarks/results/ without $OUT). Needs .whl/ from scripts/prepare_device.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "${out}"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps .whl/*.whl > "${out}/pip-wheels.log" 2>&1
fi
python3 -m pip install -q --no-index . > "${out}/pip-install.log" 2>&1 || { tail -n 40 "${out}/pip-install.log"; exit 1; }
python3 benchmarks/bench_fwd.py --rows "${1:-}" --out "${out}/h200.csv"
