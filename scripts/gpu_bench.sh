#!/usr/bin/env bash
# On the GPU machine: install the FLA wheels and the package into the machine's
# torch environment (no index needed), then run the forward benchmark over the
# rows of the published table (all rows, or those matching $1, a regular
# expression on "model,seqlens"). Writes h200.csv and h200.json to $OUT (or
# benchmarks/results/ without $OUT). Needs .whl/ from scripts/prepare_device.sh.
# FLA's Triton kernels compile on first use, which is most of a fresh machine's
# run: a compile cache carried as .triton-cache/ is used, and this run's cache
# goes back as $OUT/triton-cache.tar.gz (when under 16 MiB; unpack it into
# .triton-cache/ and carry that with the next call).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "${out}"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps .whl/*.whl > "${out}/pip-wheels.log" 2>&1
fi
python3 -m pip install -q --no-index . > "${out}/pip-install.log" 2>&1 || { tail -n 40 "${out}/pip-install.log"; exit 1; }
if [[ -d .triton-cache ]]; then
  export TRITON_CACHE_DIR="${PWD}/.triton-cache"
else
  export TRITON_CACHE_DIR="${HOME}/.triton/cache"  # Triton's default (the quick benchmark's too)
  mkdir -p "${TRITON_CACHE_DIR}"
fi
set +e
# BENCH_TIME_LIMIT (seconds): stop the benchmark then (the rows measured so far
# are kept; the sidecar says how many), so that a device call's limit leaves
# time to hand the results back.
limit=()
[[ -n "${BENCH_TIME_LIMIT:-}" ]] && limit=(timeout "${BENCH_TIME_LIMIT}")
"${limit[@]}" python3 benchmarks/bench_fwd.py --rows "${1:-}" --out "${out}/h200.csv"
bench_rc=$?
tar -czf "${out}/triton-cache.tar.gz" -C "${TRITON_CACHE_DIR}" . 2>/dev/null
if [[ $(stat -c %s "${out}/triton-cache.tar.gz" 2>/dev/null || echo 0) -ge $((16 << 20)) ]]; then
  rm -f "${out}/triton-cache.tar.gz"
fi
exit "${bench_rc}"
