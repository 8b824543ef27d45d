#!/usr/bin/env bash
# On the GPU machine, the whole check in one call: scripts/gpu_check.sh --quick
# (build, C++ suite, Python GPU suite, quick benchmark), then, if it passed, the
# full forward benchmark (scripts/gpu_bench.sh). What comes back in $OUT is kept
# to eight files: h200.csv and h200.json from the benchmark (h100.* on an H100:
# benchmarks/bench_fwd.py names them by the card), the check's logs as
# one archive, the benchmark's log and FLA's Triton compile cache in up to four
# pieces (gpu_bench.sh).
# Needs third_party/ and .whl/ from scripts/prepare_device.sh, carried with the
# call (and .triton-cache.tar.xz where an earlier run left one: scripts/lib/triton_cache.sh).
# FULL_RUN_REQUIRE_H200=1: on any other card, say so and stop at once (exit 3),
# before anything is built: a run for the H200's figures costs no device time
# on a machine that cannot give them.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
if [[ "${FULL_RUN_REQUIRE_H200:-0}" == 1 && "${card}" != *H200* ]]; then
  echo "not an H200 (${card:-no GPU found}): no run"
  exit 3
fi
out="${OUT:-/tmp/flashqla-gpu-full-run}"
mkdir -p "${out}"
logs=$(mktemp -d)
OUT="${logs}" bash scripts/gpu_check.sh --quick
check_rc=$?
tar -czf "${out}/check_logs.tar.gz" -C "${logs}" .
if [[ ${check_rc} -ne 0 ]]; then
  echo "gpu_check.sh failed (rc ${check_rc}): no benchmark"
  exit "${check_rc}"
fi
bench=$(mktemp -d)
# FULL_RUN_SECONDS: the whole run's budget (a device call's limit); the
# benchmark gets what the checks left of it, less 40 s to hand results back.
budget=${FULL_RUN_SECONDS:-0}
if [[ ${budget} -gt 0 ]]; then
  export BENCH_TIME_LIMIT=$(( budget - SECONDS - 40 > 60 ? budget - SECONDS - 40 : 60 ))
fi
OUT="${bench}" bash scripts/gpu_bench.sh "$@" > "${out}/bench.log" 2>&1
bench_rc=$?
cp "${bench}"/*.csv "${bench}"/*.json "${bench}"/triton-cache.tar.xz.part-* "${out}/" 2>/dev/null
tail -n 8 "${out}/bench.log"
exit "${bench_rc}"
