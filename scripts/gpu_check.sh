#!/usr/bin/env bash
# On the GPU machine: build everything with the CUDA backend, run the whole
# C++ suite, `pip install .` the Python package into the machine's torch
# environment, run the Python suite (GPU tests must run there, never skip), and
# print a short table.
# Needs third_party/ (and .whl/ with the FLA and transformers wheels) from
# scripts/prepare_device.sh, carried with the call. Logs go to $OUT when set.
# --quick runs only the GPU-marked part of the Python suite (the CPU part is what
# CI runs anyway); --cpp-only stops after the C++ suite (scripts/gpu_lean_run.sh);
# --python-only skips the C++ build and suite (the package's own build still
# compiles the kernels).
# The suite's FLA and transformers tests (of the selection) then run once more with
# FLA 0.6 (.whl/fla-0.6) in place of FLA 0.5.2.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pytest_select=()
cpp_only=0
python_only=0
for arg in "$@"; do
  case "${arg}" in
    --quick) pytest_select=(-m gpu) ;;
    --cpp-only) cpp_only=1 ;;
    --python-only) python_only=1 ;;
    *) echo "usage: $0 [--quick] [--cpp-only | --python-only]"; exit 2 ;;
  esac
done
out="${OUT:-/tmp/flashqla-gpu-check}"
mkdir -p "${out}"
build=build-gpu

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "${out}/gpu.txt"
build_s=- ctest_s=- total=- failed=- skipped=0 gpu_ran=- ctest_rc=0
if [[ ${python_only} -eq 0 ]]; then
  generator=()
  command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)

  start=${SECONDS}
  cmake -S . -B "${build}" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DFLASHQLA_ENABLE_CUDA=ON \
    -DFLASHQLA_GTEST_SOURCE_DIR="${PWD}/third_party/googletest" > "${out}/configure.log" 2>&1 \
    && cmake --build "${build}" -j "$(nproc)" > "${out}/build.log" 2>&1
  build_rc=$?
  build_s=$((SECONDS - start))
  if [[ ${build_rc} -ne 0 ]]; then
    tail -n 60 "${out}/configure.log" "${out}/build.log"
    echo "BUILD FAILED"
    exit 1
  fi

  source scripts/lib/gpu_probe.sh
  fq_gpu_probe "${build}" "${out}"
  start=${SECONDS}
  ctest --test-dir "${build}" --output-on-failure --timeout 120 -j 8 > "${out}/ctest.log" 2>&1
  ctest_rc=$?
  ctest_s=$((SECONDS - start))
  grep -E "Failed|\*\*\*|Skipped" "${out}/ctest.log" | head -n 40

  total=$(grep -oE "out of [0-9]+" "${out}/ctest.log" | grep -oE "[0-9]+" | tail -n 1)
  failed=$(grep -cE "Test +#[0-9]+: .*(\*\*\*|  Failed)" "${out}/ctest.log")
  skipped=$(grep -c "(Skipped)" "${out}/ctest.log")
  gpu_ran=$(grep -cE "CudaBackend\..*Passed" "${out}/ctest.log")
  if [[ ${cpp_only} -eq 1 ]]; then
    echo "build ${build_s} s, ctest ${ctest_s} s: ${total:-?} tests, ${failed:-?} failed, ${skipped} skipped" \
      "(must be 0), ${gpu_ran} CUDA backend tests passed"
    [[ ${ctest_rc} -eq 0 && ${skipped} -eq 0 ]]
    exit
  fi
fi

# --- Python package and suite ---------------------------------------------------
py=python3
if compgen -G ".whl/*.whl" >/dev/null; then
  ${py} -m pip install -q --no-index --no-deps .whl/*.whl > "${out}/pip-wheels.log" 2>&1
fi
fla_next=/tmp/flashqla-fla-0.6
rm -rf "${fla_next}"
if compgen -G ".whl/fla-0.6/*.whl" >/dev/null; then
  ${py} -m pip install -q --no-index --no-deps --target "${fla_next}" .whl/fla-0.6/*.whl >> "${out}/pip-wheels.log" 2>&1
fi
start=${SECONDS}
# No package index is reachable there; the build needs none (see pyproject.toml).
${py} -m pip install --no-index . > "${out}/pip-install.log" 2>&1
pip_rc=$?
pip_s=$((SECONDS - start))
[[ ${pip_rc} -eq 0 ]] || tail -n 40 "${out}/pip-install.log"
start=${SECONDS}
# A bound, so that a kernel that hangs fails the check instead of the whole device call.
timeout 300 ${py} -m pytest -q -rfEs -p no:cacheprovider "${pytest_select[@]}" tests/python > "${out}/pytest.log" 2>&1
pytest_rc=$?
pytest_s=$((SECONDS - start))
grep -E "^(FAILED|ERROR|SKIPPED)" "${out}/pytest.log" | head -n 30
py_summary=$(tail -n 1 "${out}/pytest.log")
py_gpu_skipped=$(grep -cE "^SKIPPED.*(test_gpu|\[cuda\]|on_cuda)" "${out}/pytest.log")
# The FLA and transformers tests again, with FLA 0.6.
next_select="fla or transformers"
[[ ${#pytest_select[@]} -gt 0 ]] && next_select="gpu and (${next_select})"
start=${SECONDS}
if [[ -d "${fla_next}/fla" ]]; then
  PYTHONPATH="${fla_next}" timeout 300 ${py} -m pytest -q -rfEs -p no:cacheprovider -m "${next_select}" tests/python \
    > "${out}/pytest-fla-0.6.log" 2>&1
  next_rc=$?
  grep -E "^(FAILED|ERROR|SKIPPED)" "${out}/pytest-fla-0.6.log" | head -n 30
  next_summary="FLA $(PYTHONPATH="${fla_next}" ${py} -c 'import fla; print(fla.__version__)' 2>/dev/null):"
  next_summary+=" $(tail -n 1 "${out}/pytest-fla-0.6.log")"
else
  next_rc=1
  next_summary="FLA 0.6 wheels missing (.whl/fla-0.6: scripts/prepare_device.sh)"
fi
next_s=$((SECONDS - start))

# --- quick benchmark (two rows of the published table, against FLA) -------------
# FLA's Triton compile cache from an earlier run, where one was carried (gpu_bench.sh).
source scripts/lib/triton_cache.sh
fq_use_triton_cache
start=${SECONDS}
${py} benchmarks/bench_fwd.py --rows '^397B/122B TP(8|1),1x8192$' --reps 5 --out "${out}/bench_quick.csv" \
  > "${out}/bench_quick.log" 2>&1
bench_rc=$?
bench_s=$((SECONDS - start))

echo
echo "| step                         | result |"
echo "|------------------------------|--------|"
printf "| build (s)                    | %6s |\n" "${build_s}"
printf "| ctest (s)                    | %6s |\n" "${ctest_s}"
printf "| tests total                  | %6s |\n" "${total:-?}"
printf "| tests failed                 | %6s |\n" "${failed:-?}"
printf "| tests skipped (must be 0)    | %6s |\n" "${skipped}"
printf "| CUDA backend tests passed    | %6s |\n" "${gpu_ran}"
printf "| pip install . (s, rc)        | %3s %2s |\n" "${pip_s}" "${pip_rc}"
printf "| pytest (s, rc)               | %3s %2s |\n" "${pytest_s}" "${pytest_rc}"
printf "| python GPU tests skipped     | %6s |\n" "${py_gpu_skipped}"
printf "| pytest, FLA 0.6 (s, rc)      | %3s %2s |\n" "${next_s}" "${next_rc}"
printf "| quick benchmark (s, rc)      | %3s %2s |\n" "${bench_s}" "${bench_rc}"
echo "pytest: FLA $(${py} -c 'import fla; print(fla.__version__)' 2>/dev/null), transformers" \
  "$(${py} -c 'import transformers; print(transformers.__version__)' 2>/dev/null): ${py_summary}"
echo "pytest with FLA 0.6: ${next_summary}"
grep -E "flashqla .* ms|latency" "${out}/bench_quick.log" | cut -c1-150
[[ ${ctest_rc} -eq 0 && ${skipped} -eq 0 && ${pip_rc} -eq 0 && ${pytest_rc} -eq 0 && ${py_gpu_skipped} -eq 0 \
   && ${next_rc} -eq 0 && ${bench_rc} -eq 0 ]]
