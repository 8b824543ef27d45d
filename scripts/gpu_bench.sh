#!/usr/bin/env bash
# On the GPU machine: install the FLA wheels and the package into the machine's
# torch environment (no index needed), then run the forward benchmark over the
# rows of the published table (all rows, or those matching $1, a regular
# expression on "model,seqlens"). Writes h200.csv and h200.json to $OUT (or
# benchmarks/results/ without $OUT), named by the card (bench_fwd.py):
# h100.csv and h100.json on an H100 (gpu.* on any other), so that no other
# card's run passes for the H200's. Needs .whl/ from scripts/prepare_device.sh.
# FLA's Triton kernels compile on first use, which is most of a fresh machine's
# run: a compile cache carried as .triton-cache.tar.xz is used (scripts/lib/
# triton_cache.sh), and this run's cache goes back as
# $OUT/triton-cache.tar.xz.part-aa, -ab, ... (15 MiB pieces, at most four: what a
# device call hands back; here, cat the pieces > .triton-cache.tar.xz and carry
# that with the next call).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "${out}"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps .whl/*.whl > "${out}/pip-wheels.log" 2>&1
fi
python3 -m pip install -q --no-index . > "${out}/pip-install.log" 2>&1 || { tail -n 40 "${out}/pip-install.log"; exit 1; }
source scripts/lib/triton_cache.sh
fq_use_triton_cache
set +e
# BENCH_TIME_LIMIT (seconds): stop the benchmark then (the rows measured so far
# are kept; the sidecar says how many), so that a device call's limit leaves
# time to hand the results back.
limit=()
[[ -n "${BENCH_TIME_LIMIT:-}" ]] && limit=(timeout "${BENCH_TIME_LIMIT}")
"${limit[@]}" python3 benchmarks/bench_fwd.py --rows "${1:-}" --out-dir "${out}"
bench_rc=$?
cache_tar=$(mktemp)
if XZ_OPT=-T0 tar -cJf "${cache_tar}" -C "${TRITON_CACHE_DIR}" . 2>/dev/null \
    && [[ $(stat -c %s "${cache_tar}") -le $((60 << 20)) ]]; then
  split -b $((15 << 20)) "${cache_tar}" "${out}/triton-cache.tar.xz.part-"
fi
rm -f "${cache_tar}"
exit "${bench_rc}"
