#!/usr/bin/env bash
# On the GPU machine, the short kernel-development loop (about a minute):
# build the C++ library and tests with the CUDA backend, run the GPU tests of
# the C++ suite, then the fused kernel's timing and phase profile
# (benchmarks/tools/fused_phase_profile.cu), the wgmma rates of its operand
# layouts (benchmarks/tools/wgmma_rate.cu), what the producer's wgmma batch
# costs its issuing warps (benchmarks/tools/wgmma_issue.cu) and a short table.
# scripts/gpu_check.sh is the full check (Python suite and benchmark included).
# Needs third_party/ from scripts/prepare_device.sh, carried with the call.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-/tmp/flashqla-gpu-iterate}"
mkdir -p "${out}"
build=build-gpu
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
nvcc_flags=(-std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -Iinclude -Isrc -Ithird_party/cutlass/include)
tool_sources=(benchmarks/tools/fused_phase_profile.cu src/cuda/sm90/gdn_fwd_simple_sm90.cu)

# The two timing tools compile while the library builds.
nvcc "${nvcc_flags[@]}" "${tool_sources[@]}" -o /tmp/fused_timing > "${out}/tool.log" 2>&1 &
timing_pid=$!
nvcc "${nvcc_flags[@]}" -DFLASHQLA_FUSED_PROFILE "${tool_sources[@]}" -o /tmp/fused_profile \
  > "${out}/tool-profile.log" 2>&1 &
profile_pid=$!
# Each side of the fused kernel alone (FLASHQLA_FUSED_ISOLATE: 1 the state
# warpgroups, 2 the producer), for standalone phase costs.
for side in 1 2; do
  nvcc "${nvcc_flags[@]}" -DFLASHQLA_FUSED_PROFILE -DFLASHQLA_FUSED_ISOLATE=${side} "${tool_sources[@]}" \
    -o /tmp/fused_isolate_${side} > "${out}/tool-isolate-${side}.log" 2>&1 &
done
nvcc "${nvcc_flags[@]}" benchmarks/tools/wgmma_rate.cu -o /tmp/wgmma_rate > "${out}/tool-rate.log" 2>&1 &
rate_pid=$!
nvcc "${nvcc_flags[@]}" benchmarks/tools/wgmma_issue.cu -o /tmp/wgmma_issue > "${out}/tool-issue.log" 2>&1 &
issue_pid=$!
start=${SECONDS}
cmake -S . -B "${build}" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHQLA_ENABLE_CUDA=ON \
  -DFLASHQLA_GTEST_SOURCE_DIR="${PWD}/third_party/googletest" > "${out}/configure.log" 2>&1 \
  && cmake --build "${build}" -j "$(nproc)" > "${out}/build.log" 2>&1
build_rc=$?
wait ${timing_pid}
timing_rc=$?
wait ${profile_pid}
profile_rc=$?
wait ${rate_pid}
rate_rc=$?
wait ${issue_pid}
issue_rc=$?
build_s=$((SECONDS - start))
if [[ ${build_rc} -ne 0 || ${timing_rc} -ne 0 || ${profile_rc} -ne 0 || ${rate_rc} -ne 0 || ${issue_rc} -ne 0 ]]; then
  tail -n 40 "${out}/build.log" "${out}/tool.log" "${out}/tool-profile.log" "${out}/tool-rate.log" "${out}/tool-issue.log"
  echo "BUILD FAILED"
  exit 1
fi

source scripts/lib/gpu_probe.sh
fq_gpu_probe "${build}" "${out}"
start=${SECONDS}
ctest --test-dir "${build}" --output-on-failure --timeout 120 -j 8 -R "Cuda|Sm90|gpu_" > "${out}/ctest.log" 2>&1
ctest_rc=$?
ctest_s=$((SECONDS - start))
grep -E "\*\*\*|Failed|Skipped" "${out}/ctest.log" | head -n 30
timeout 120 /tmp/fused_timing > "${out}/timing.log" 2>&1
timeout 120 /tmp/fused_profile > "${out}/profile.log" 2>&1
timeout 60 /tmp/wgmma_rate > "${out}/rate.log" 2>&1
timeout 60 /tmp/wgmma_issue > "${out}/issue.log" 2>&1
for side in 1 2; do
  [[ -x /tmp/fused_isolate_${side} ]] && timeout 60 /tmp/fused_isolate_${side} 2>&1 | grep -E "^B=|cycles|state:|producer:|per chunk" \
    > "${out}/isolate-${side}.log"
done
cat "${out}/rate.log" "${out}/issue.log" "${out}/profile.log"
echo "--- state warpgroups alone (producer only hands stages over):"; cat "${out}/isolate-1.log"
echo "--- producer alone (state warpgroups only release stages):"; cat "${out}/isolate-2.log"
echo
echo "| step                        | result |"
echo "|-----------------------------|--------|"
printf "| build (s)                   | %6s |\n" "${build_s}"
printf "| GPU C++ tests (s, rc)       | %3s %2s |\n" "${ctest_s}" "${ctest_rc}"
printf "| GPU C++ tests total/skipped | %3s %2s |\n" \
  "$(grep -oE "out of [0-9]+" "${out}/ctest.log" | grep -oE "[0-9]+" | tail -n 1)" "$(grep -c "(Skipped)" "${out}/ctest.log")"
cat "${out}/timing.log"
[[ ${ctest_rc} -eq 0 ]]
