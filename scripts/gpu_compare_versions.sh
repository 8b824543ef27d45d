#!/usr/bin/env bash
# On the GPU machine: builds the fused kernel's timing tool
# (benchmarks/tools/fused_phase_profile.cu, this checkout's) for every version exported by
# scripts/export_versions.sh into versions/, plain and with the phase profile,
# and runs them one after the other: per-chunk latency, phase cycles and the
# relative difference to the simple kernel (and each side alone),
# for kernel versions side by side in one call. A triage tool: the GPU suite
# (gpu_iterate.sh, gpu_check.sh) is what shows a version correct. Needs
# third_party/ (CUTLASS) and versions/, carried. COMPARE_QUICK=1 leaves out
# each side alone (half the builds and runs, for a short device call).
# COMPARE_WGMMA_ISSUE=1 also runs this checkout's benchmarks/tools/wgmma_issue.cu
# (what the kernel's wgmma batches cost their issuing warps, by shape), first.
set -uo pipefail
quick=${COMPARE_QUICK:-0}
wgmma_issue=${COMPARE_WGMMA_ISSUE:-0}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-/tmp/flashqla-compare}"
mkdir -p "${out}"
build_logs=$(mktemp -d)
if [[ ${wgmma_issue} -eq 1 ]]; then
  nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -Iinclude -Isrc -Ithird_party/cutlass/include \
    benchmarks/tools/wgmma_issue.cu -o /tmp/wgmma_issue > "${build_logs}/wgmma_issue.log" 2>&1 &
fi
for dir in versions/*/; do
  name=$(basename "${dir}")
  flags=(-std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -I"${dir}include" -I"${dir}src"
         -Ithird_party/cutlass/include)
  # The timing tool of this checkout for every version (the same shapes and
  # timing for all; its interface, launch_gdn_fwd_fused, is each version's).
  sources=(benchmarks/tools/fused_phase_profile.cu "${dir}src/cuda/sm90/gdn_fwd_simple_sm90.cu")
  nvcc "${flags[@]}" "${sources[@]}" -o "/tmp/timing_${name}" > "${build_logs}/${name}.log" 2>&1 &
  nvcc "${flags[@]}" -Xptxas=-v -DFLASHQLA_FUSED_PROFILE "${sources[@]}" -o "/tmp/profile_${name}" \
    > "${build_logs}/${name}-profile.log" 2>&1 &
  [[ ${quick} -eq 1 ]] && continue
  # The producer alone (the state warpgroups only release stages).
  nvcc "${flags[@]}" -Xptxas=-v -DFLASHQLA_FUSED_PROFILE -DFLASHQLA_FUSED_ISOLATE=2 "${sources[@]}" -o "/tmp/producer_${name}" \
    > "${build_logs}/${name}-producer.log" 2>&1 &
  # The state warpgroups alone (the producer works on the first two chunks only).
  nvcc "${flags[@]}" -Xptxas=-v -DFLASHQLA_FUSED_PROFILE -DFLASHQLA_FUSED_ISOLATE=1 "${sources[@]}" -o "/tmp/state_${name}" \
    > "${build_logs}/${name}-state.log" 2>&1 &
done
wait
if [[ ${wgmma_issue} -eq 1 ]]; then
  { /tmp/wgmma_issue 2>&1 || tail -n 15 "${build_logs}/wgmma_issue.log"; } | tee "${out}/wgmma_issue.txt"
fi
for dir in versions/*/; do
  name=$(basename "${dir}")
  echo "=== ${name}: $(grep "^${name} " versions/index.txt | cut -d' ' -f2-)"
  if [[ ! -x "/tmp/timing_${name}" ]]; then
    echo "build failed:"; tail -n 15 "${build_logs}/${name}.log"; continue
  fi
  # A profile build that spills or serializes its wgmmas times another kernel.
  for log in "${build_logs}/${name}"-*.log; do
    if grep -qE "[1-9][0-9]* bytes spill stores|C7512" "${log}"; then
      echo "  WARNING: $(basename "${log}" .log) spills or serializes wgmmas: its cycles and times do not describe the kernel"
    fi
  done
  timeout 60 "/tmp/timing_${name}" 2>&1 | grep -E "^B=|us per chunk|relative difference|error" 
  # The phase profile of one chain and of the 256 chains at full load (shapes 0
  # and 2 of the tool).
  [[ -x "/tmp/profile_${name}" ]] && timeout 60 "/tmp/profile_${name}" 0,2 2>&1 |
    grep -E "^B=|cycles per chunk|producer:" | sed 's/^B=/  profile of B=/'
  if [[ -x "/tmp/producer_${name}" ]]; then
    echo "  producer alone:"
    timeout 60 "/tmp/producer_${name}" 2>&1 | grep -E "producer:|us per chunk" | head -n 2
  fi
  if [[ -x "/tmp/state_${name}" ]]; then
    echo "  state alone:"
    timeout 60 "/tmp/state_${name}" 2>&1 | grep -E "state:|us per chunk" | head -n 2
  fi
done | tee "${out}/compare.txt"
echo
python3 scripts/lib/compare_summary.py "${out}/compare.txt" | tee "${out}/summary.md"
