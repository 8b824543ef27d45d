#!/usr/bin/env bash
# The GPU machine's driver: one subcommand per job (scripts/gpu.sh --help).
# Every build goes through the library's CMake project and flags
# (scripts/lib/build.sh, scripts/lib/gpu_common.sh): the library and its tests in
# build-gpu/, the kernel tools (benchmarks/tools/) as targets of the same
# project. What it needs comes carried: third_party/ and .whl/ from
# scripts/prepare_device.sh, versions/ from scripts/export_versions.sh (compare),
# .triton-cache.tar.xz from an earlier benchmark. Logs and results go to $OUT
# when set (each subcommand has its own default).
set -uo pipefail
FQ_GPU_SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/gpu.sh"
source "$(dirname "${FQ_GPU_SELF}")/lib/build.sh"
source "$(dirname "${FQ_GPU_SELF}")/lib/gpu_common.sh"
cd "${FLASHQLA_REPO_ROOT}" || exit 1

usage() {
  cat <<'EOF'
usage: scripts/gpu.sh <command> [options]        (on the GPU machine)

  check [--quick] [--cpp-only | --python-only]
      Build the library and its tests (build-gpu/, CUDA backend), run the whole
      C++ suite, install the package into the machine's torch (the carried
      .whl/flashqla wheel of scripts/build_wheel.sh when it was built from these
      sources, else `pip install .`; so in every command below), run the Python suite
      (GPU tests must run, never skip), its FLA and transformers tests again with
      FLA 0.6 (.whl/fla-0.6), a quick benchmark (two published rows, per-chunk
      latency), and print a table. --quick: only the GPU-marked Python tests;
      --cpp-only: stop after the C++ suite; --python-only: no C++ build or suite.
      Default $OUT: /tmp/flashqla-gpu-check.
  bench [ROWS-REGEX]
      Install the carried wheels and the package, run the forward benchmark over
      the published rows (those matching ROWS-REGEX on "model,seqlens"), write
      h200.csv / h200.json named by the card (h100.* on an H100) and FLA's Triton
      cache as triton-cache.tar.xz.part-*. BENCH_TIME_LIMIT=S stops the benchmark
      after S seconds, keeping the rows measured. Default $OUT: benchmarks/results.
  bench-bwd [ROWS-REGEX]
      As bench, for the backward: benchmarks/bench_bwd.py over the 32 published
      backward rows (those matching ROWS-REGEX on "model,seqlens", e.g.
      'hk16_hv32,'): flashqla's backward, FLA's, a training step of each, and
      flashqla's training forward over its inference forward. Its rows
      (direction=bwd) go into h200.csv / h100.csv beside the forward's (kept), its
      environment into the sidecar's "bwd" key, its plot into h200_bwd.png
      (h100_bwd.png). BENCH_TIME_LIMIT=S as for bench (the rows measured are
      plotted). Default $OUT: benchmarks/results.
  bench-serving [ROWS-REGEX]
      The serving entry's benchmark (benchmarks/bench_serving.py): the state-pool
      call against the plain forward and against gather + call + scatter on the
      1024x8, 2048x4, 4096x8 and 8192x4 rows, both pool layouts; writes
      serving_h200.csv (serving_h100.csv) and its sidecar.
      Default $OUT: benchmarks/results.
  scale [SCALE_CHECK ARGS...]
      The scale runs (benchmarks/scale_check.py): one 1M-token sequence and a
      270K-token call at HV = 64 (2.2e9 elements in v), forward and backward against
      the CPU backend in fp64 on the first and last q/k head's group, peak memory,
      and a backward too large for the card failing cleanly; writes scale_h200.json
      (scale_h100.json) after each case. The fp64 reference on the CPU takes about
      three minutes a checked group (H100 machine): split the work over calls with
      --cases and --ref-heads (e.g. `scale --cases oom,long`, then `scale --cases
      wide --ref-heads 0`, `--ref-heads -1`); the JSON keeps what earlier calls wrote.
      Default $OUT: benchmarks/results.
  bench-cp [BENCH_CP ARGS...]
      Context parallelism (benchmarks/bench_cp.py): one sequence of FlashQLA's
      published CP rows (32K to 1M tokens, five head configurations) split over
      2, 4 and 8 GPUs (--worlds; those above the machine's count left out) with
      NCCL, inference and training, against the whole sequence on one GPU and
      FlashQLA's published H200 x 8 figures; writes cp_h200.csv (cp_h100.csv).
      Needs a machine with several GPUs. Default $OUT: benchmarks/results.
  full [--lean] [--require-h200] [--budget S] [ROWS-REGEX]
      check --quick, then (if it passed) bench; $OUT gets the benchmark's files,
      its log and the check's logs as check_logs.tar.gz. --lean, for short device
      time: check --cpp-only, bench, then the Python GPU tests, each result in $OUT
      as it is written. --require-h200 (FULL_RUN_REQUIRE_H200=1): on any other
      card stop at once (exit 3). --budget S (FULL_RUN_SECONDS): the whole run's
      seconds; the benchmark gets what is left less 40 s.
      Default $OUT: /tmp/flashqla-gpu-full-run.
  ncu-bwd [--shape N] [--kernels REGEX]
      Nsight Compute (--set full) on the tensor-core backward's kernels of one
      backward_latency shape (default 0, hk16_hv32 8k_1seq): the first launch of
      each kernel matching REGEX (default gdn_bwd_tc), its details and per-line
      SASS as CSV and a short summary (time, SM and memory throughput, occupancy,
      top stall reasons) per kernel. Default $OUT: /tmp/flashqla-ncu-bwd.
  h200-figures [--budget S] [--any-card] [STEP...]
      The figures the docs owe from an H200, in the fewest calls: the STEPs in
      order (default: serving check scale-long), each skipped where its usual
      time no longer fits the budget (S seconds, default 560), each writing its
      results as it goes. Steps: serving (bench-serving), check (check
      --cpp-only: the C++ suite and the sanitizers), sanitize, scale-long (scale
      --cases oom,long), scale-wide (scale --cases wide). On any other card it
      stops at once (exit 3) unless --any-card. Default $OUT: benchmarks/results
      (check's logs in $OUT/check).
  iterate
      The kernel loop (about a minute): build the library, its tests and the
      fused kernel's tools, run the GPU tests of the C++ suite, then the kernel's
      per-chunk timing and the wgmma tools.
      Default $OUT: /tmp/flashqla-gpu-iterate.
  bwd-iterate
      The backward's loop (about two minutes): build the library, its tests and
      benchmarks/tools/backward_latency, run the C++ suite's backward GPU tests
      (both kernels), the backward's latency (BWD_SHAPES, default 0,1,2,4,5) and
      each backward kernel's time under Nsight Compute (BWD_NCU_SHAPES, 0,4).
      BWD_GRADS="warps ...": also each of these grads kernels
      (FLASHQLA_BACKWARD_GRADS): a short first case (a hang stops the run), the
      backward GPU tests under it, and its latency beside the default's,
      interleaved over BWD_ROUNDS rounds (1).
      Default $OUT: /tmp/flashqla-gpu-bwd-iterate.
  bwd-compare NAME=LIBDIR[,VAR=VALUE...] ...
      The backward's candidates side by side without building anything there:
      benchmarks/tools/backward_latency and tests/flashqla_tests prebuilt here
      (BWD_BUILD, default build-local: carry both and each LIBDIR), each NAME a
      folder holding a libflashqla.so.0 (and its own tests/flashqla_tests build as
      flashqla_tests where its tests differ) and optional environment settings (e.g.
      warps=build-local/cmp/main,FLASHQLA_BACKWARD_GRADS=warps). Per candidate: a
      short first case (a hang drops it from the timing) and the backward GPU tests
      (BWD_TESTS=0: none; a list of NAMEs: those candidates' only); then the backward's latency on BWD_SHAPES
      (0,1,2,4,5,7,8), the candidates interleaved over BWD_ROUNDS rounds (2),
      and a table of the times, a column a candidate.
      Default $OUT: /tmp/flashqla-bwd-compare.
  compare [--quick] [--wgmma-issue] [VERSION...]
      Time kernel versions side by side in one call: each version's fused kernel
      in this checkout's timing tool (per-chunk latency of five shapes, relative
      difference to the simple kernel), the versions interleaved over three rounds
      (differences of 1% at full load are real: one version after the other is
      not), then a summary table of the means. A VERSION is a folder name in
      versions/ or, where git and the history are at hand, any commit (exported
      into versions/ first); none: every exported version. --quick
      (COMPARE_QUICK=1): one round; --wgmma-issue (COMPARE_WGMMA_ISSUE=1):
      benchmarks/tools/wgmma_issue first. A triage tool: the GPU suite (check)
      shows a version correct.
      Default $OUT: /tmp/flashqla-compare.
  sanitize
      compute-sanitizer memcheck, initcheck, racecheck and synccheck over every
      kernel on small shapes (cases of the C++ GPU suites: the backward's
      tensor-core and simple kernels; the forward's fused and simple kernels,
      piece passes with the piece scan, chained pieces). memcheck and initcheck
      on packed sequences with empty ones, odd head sizes, strided views, l2norm
      and GQA; racecheck and synccheck, far slower, on short ones. `check` runs
      it after the C++ suite. Default $OUT: /tmp/flashqla-sanitize.
  ncu [--shape N] [VERSION-DIR]
      Nsight Compute profile of the fused kernel (first launch of the timing
      tool; shape 0: one sequence of 8192 tokens, 2 (NCU_SHAPE=2): 256 chains at
      full load), with per-instruction stall samples: prof.ncu-rep, source.csv,
      details.csv and the binary's cubins (for benchmarks/tools/ncu_by_line.py).
      VERSION-DIR: a version exported into versions/ instead of this checkout.
      Default $OUT: /tmp/flashqla-ncu.

Here, not there: scripts/prepare_device.sh (third_party/, .whl/),
scripts/export_versions.sh REF... (versions/ for compare).
EOF
}

# --- check -------------------------------------------------------------------
cmd_check() {
  local pytest_select=() cpp_only=0 python_only=0 arg
  for arg in "$@"; do
    case "${arg}" in
      --quick) pytest_select=(-m gpu) ;;
      --cpp-only) cpp_only=1 ;;
      --python-only) python_only=1 ;;
      *) echo "usage: scripts/gpu.sh check [--quick] [--cpp-only | --python-only]"; exit 2 ;;
    esac
  done
  local out="${OUT:-/tmp/flashqla-gpu-check}"
  mkdir -p "${out}"
  local build=build-gpu start

  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "${out}/gpu.txt"
  local build_s=- ctest_s=- total=- failed=- skipped=0 gpu_ran=- ctest_rc=0
  if [[ ${python_only} -eq 0 ]]; then
    start=${SECONDS}
    fq_gpu_configure_and_build "${build}" "${out}"
    build_s=$((SECONDS - start))

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
    local sanitize_line
    sanitize_line=$(OUT="${out}" cmd_sanitize | tail -n 1)
    echo "${sanitize_line}"
    [[ ${sanitize_line} == *FAILED* ]] && ctest_rc=1
    if [[ ${cpp_only} -eq 1 ]]; then
      echo "build ${build_s} s, ctest ${ctest_s} s: ${total:-?} tests, ${failed:-?} failed, ${skipped} skipped" \
        "(must be 0), ${gpu_ran} CUDA backend tests passed"
      [[ ${ctest_rc} -eq 0 && ${skipped} -eq 0 ]]
      exit
    fi
  fi

  # --- Python package and suite
  local py=python3
  fq_install_wheels "${out}/pip-wheels.log"
  local fla_next=/tmp/flashqla-fla-0.6
  rm -rf "${fla_next}"
  if compgen -G ".whl/fla-0.6/*.whl" >/dev/null; then
    ${py} -m pip install -q --no-index --no-deps --target "${fla_next}" .whl/fla-0.6/*.whl >> "${out}/pip-wheels.log" 2>&1
  fi
  start=${SECONDS}
  # No package index is reachable there; the build needs none (see pyproject.toml).
  fq_install_flashqla "${out}/pip-install.log"
  local pip_rc=$?
  local pip_s=$((SECONDS - start))
  [[ ${pip_rc} -eq 0 ]] || tail -n 40 "${out}/pip-install.log"
  start=${SECONDS}
  # A bound, so that a kernel that hangs fails the check instead of the whole run
  # (on an H100, 81 of the backward's 129 GPU tests took 212 s; the rest include
  # Inductor compiles and FLA's first autotune).
  timeout 480 ${py} -m pytest -q -rfEs -p no:cacheprovider "${pytest_select[@]}" tests/python > "${out}/pytest.log" 2>&1
  local pytest_rc=$?
  local pytest_s=$((SECONDS - start))
  grep -E "^(FAILED|ERROR|SKIPPED)" "${out}/pytest.log" | head -n 30
  local py_summary py_gpu_skipped
  py_summary=$(tail -n 1 "${out}/pytest.log")
  py_gpu_skipped=$(grep -cE "^SKIPPED.*(test_gpu|\[cuda\]|on_cuda)" "${out}/pytest.log")
  # The FLA and transformers tests again, with FLA 0.6.
  local next_select="fla or transformers" next_rc next_summary
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
  local next_s=$((SECONDS - start))

  # --- quick benchmark (two rows of the published table, against FLA)
  # FLA's Triton compile cache from an earlier run, where one was carried (bench).
  fq_use_triton_cache
  start=${SECONDS}
  ${py} benchmarks/bench_fwd.py --rows '^397B/122B TP(8|1),1x8192$' --reps 5 --out "${out}/bench_quick.csv" \
    > "${out}/bench_quick.log" 2>&1
  local bench_rc=$?
  local bench_s=$((SECONDS - start))

  echo
  echo "| step                         | result |"
  echo "|------------------------------|--------|"
  printf "| build (s)                    | %6s |\n" "${build_s}"
  printf "| ctest (s)                    | %6s |\n" "${ctest_s}"
  printf "| tests total                  | %6s |\n" "${total:-?}"
  printf "| tests failed                 | %6s |\n" "${failed:-?}"
  printf "| tests skipped (must be 0)    | %6s |\n" "${skipped}"
  printf "| CUDA backend tests passed    | %6s |\n" "${gpu_ran}"
  printf "| install flashqla (s, rc)     | %3s %2s |\n" "${pip_s}" "${pip_rc}"
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
}

# --- bench, bench-bwd ---------------------------------------------------------
# run_benchmark <script> [ROWS-REGEX]: installs the carried wheels and the package,
# runs the benchmark script over the published rows (under BENCH_TIME_LIMIT when
# set) into $OUT, and saves FLA's Triton cache there; exits with its status.
run_benchmark() {
  local script=$1
  shift
  local out="${OUT:-benchmarks/results}"
  mkdir -p "${out}"
  fq_install_wheels "${out}/pip-wheels.log" || { tail -n 20 "${out}/pip-wheels.log"; exit 1; }
  fq_install_flashqla "${out}/pip-install.log" || { tail -n 40 "${out}/pip-install.log"; exit 1; }
  fq_use_triton_cache
  local limit=()
  [[ -n "${BENCH_TIME_LIMIT:-}" ]] && limit=(timeout "${BENCH_TIME_LIMIT}")
  "${limit[@]}" python3 "${script}" --rows "${1:-}" --out-dir "${out}"
  local bench_rc=$?
  fq_save_triton_cache "${out}"
  exit "${bench_rc}"
}

cmd_bench() {
  [[ $# -le 1 && "${1:-}" != -* ]] || { echo "usage: scripts/gpu.sh bench [ROWS-REGEX]"; exit 2; }
  run_benchmark benchmarks/bench_fwd.py "$@"
}

cmd_bench_bwd() {
  [[ $# -le 1 && "${1:-}" != -* ]] || { echo "usage: scripts/gpu.sh bench-bwd [ROWS-REGEX]"; exit 2; }
  run_benchmark benchmarks/bench_bwd.py "$@"
}

cmd_scale() {
  local out="${OUT:-benchmarks/results}"
  mkdir -p "${out}"
  fq_install_wheels "${out}/pip-wheels.log" || { tail -n 20 "${out}/pip-wheels.log"; exit 1; }
  fq_install_flashqla "${out}/pip-install.log" || { tail -n 40 "${out}/pip-install.log"; exit 1; }
  PYTHONUNBUFFERED=1 python3 benchmarks/scale_check.py --out-dir "${out}" "$@" 2>&1 | tee "${out}/scale.log"
  exit "${PIPESTATUS[0]}"
}

cmd_bench_cp() {
  local out="${OUT:-benchmarks/results}"
  mkdir -p "${out}"
  fq_install_flashqla "${out}/pip-install.log" || { tail -n 40 "${out}/pip-install.log"; exit 1; }
  PYTHONUNBUFFERED=1 python3 benchmarks/bench_cp.py --out-dir "${out}" "$@" 2>&1 | tee "${out}/bench_cp.log"
  exit "${PIPESTATUS[0]}"
}

cmd_bench_serving() {
  [[ $# -le 1 && "${1:-}" != -* ]] || { echo "usage: scripts/gpu.sh bench-serving [ROWS-REGEX]"; exit 2; }
  run_benchmark benchmarks/bench_serving.py "$@"
}

# --- full --------------------------------------------------------------------
cmd_full() {
  local lean=0 require_h200=${FULL_RUN_REQUIRE_H200:-0} budget=${FULL_RUN_SECONDS:-0} rows=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --lean) lean=1 ;;
      --require-h200) require_h200=1 ;;
      --budget) budget=${2:?--budget needs seconds}; shift ;;
      -*) echo "usage: scripts/gpu.sh full [--lean] [--require-h200] [--budget S] [ROWS-REGEX]"; exit 2 ;;
      *) rows+=("$1") ;;
    esac
    shift
  done
  local card
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  if [[ "${require_h200}" == 1 && "${card}" != *H200* ]]; then
    echo "not an H200 (${card:-no GPU found}): no run"
    exit 3
  fi
  local out="${OUT:-/tmp/flashqla-gpu-full-run}"
  mkdir -p "${out}"
  local logs
  logs=$(mktemp -d)
  if [[ ${lean} -eq 1 ]]; then
    # Results land in $OUT as they are written: a run cut short keeps what it measured.
    OUT="${logs}" bash "${FQ_GPU_SELF}" check --cpp-only || { tail -n 30 "${logs}/ctest.log"; exit 1; }
    OUT="${out}" bash "${FQ_GPU_SELF}" bench "${rows[@]}" > "${out}/bench.log" 2>&1
    local bench_rc=$?
    tail -n 4 "${out}/bench.log"
    python3 -m pytest -q -rs -p no:cacheprovider -m gpu tests/python > "${out}/pytest.log" 2>&1
    local pytest_rc=$?
    grep -E "^(FAILED|ERROR|SKIPPED)" "${out}/pytest.log" | head -n 20
    echo "pytest -m gpu (rc ${pytest_rc}): $(tail -n 1 "${out}/pytest.log")"
    [[ ${bench_rc} -eq 0 && ${pytest_rc} -eq 0 ]]
    exit
  fi
  OUT="${logs}" bash "${FQ_GPU_SELF}" check --quick
  local check_rc=$?
  tar -czf "${out}/check_logs.tar.gz" -C "${logs}" .
  if [[ ${check_rc} -ne 0 ]]; then
    echo "check failed (rc ${check_rc}): no benchmark"
    exit "${check_rc}"
  fi
  local bench
  bench=$(mktemp -d)
  if [[ ${budget} -gt 0 ]]; then
    export BENCH_TIME_LIMIT=$(( budget - SECONDS - 40 > 60 ? budget - SECONDS - 40 : 60 ))
  fi
  OUT="${bench}" bash "${FQ_GPU_SELF}" bench "${rows[@]}" > "${out}/bench.log" 2>&1
  local bench_rc=$?
  cp "${bench}"/*.csv "${bench}"/*.json "${bench}"/triton-cache.tar.xz.part-* "${out}/" 2>/dev/null
  tail -n 8 "${out}/bench.log"
  exit "${bench_rc}"
}

# --- iterate -----------------------------------------------------------------
cmd_iterate() {
  [[ $# -eq 0 ]] || { echo "usage: scripts/gpu.sh iterate"; exit 2; }
  local out="${OUT:-/tmp/flashqla-gpu-iterate}"
  mkdir -p "${out}"
  local build=build-gpu start
  local bin="${build}/benchmarks/tools"
  local tools=(fused_timing-current wgmma_rate wgmma_issue)
  start=${SECONDS}
  fq_gpu_configure_and_build "${build}" "${out}" all "${tools[@]}"
  local build_s=$((SECONDS - start))

  fq_gpu_probe "${build}" "${out}"
  start=${SECONDS}
  ctest --test-dir "${build}" --output-on-failure --timeout 120 -j 8 -R "Cuda|Sm90|gpu_" > "${out}/ctest.log" 2>&1
  local ctest_rc=$?
  local ctest_s=$((SECONDS - start))
  grep -E "\*\*\*|Failed|Skipped" "${out}/ctest.log" | head -n 30
  timeout 120 "${bin}/fused_timing-current" > "${out}/timing.log" 2>&1
  timeout 60 "${bin}/wgmma_rate" > "${out}/rate.log" 2>&1
  timeout 60 "${bin}/wgmma_issue" > "${out}/issue.log" 2>&1
  cat "${out}/rate.log" "${out}/issue.log" "${out}/timing.log"
  echo
  echo "| step                        | result |"
  echo "|-----------------------------|--------|"
  printf "| build (s)                   | %6s |\n" "${build_s}"
  printf "| GPU C++ tests (s, rc)       | %3s %2s |\n" "${ctest_s}" "${ctest_rc}"
  printf "| GPU C++ tests total/skipped | %3s %2s |\n" \
    "$(grep -oE "out of [0-9]+" "${out}/ctest.log" | grep -oE "[0-9]+" | tail -n 1)" "$(grep -c "(Skipped)" "${out}/ctest.log")"
  cat "${out}/timing.log"
  [[ ${ctest_rc} -eq 0 ]]
}

# --- bwd-compare -------------------------------------------------------------
cmd_bwd_compare() {
  [[ $# -ge 1 ]] || { echo "usage: scripts/gpu.sh bwd-compare NAME=LIBDIR[,VAR=VALUE...] ..."; exit 2; }
  local out="${OUT:-/tmp/flashqla-bwd-compare}" build="${BWD_BUILD:-build-local}"
  local bin="${build}/benchmarks/tools/backward_latency" tests="${build}/tests/flashqla_tests"
  [[ -x "${bin}" ]] || { echo "no ${bin}: build it here (target backward_latency) and carry it"; exit 2; }
  mkdir -p "${out}"
  local names=() spec name rest rc round
  declare -A envs testers
  for spec in "$@"; do
    name=${spec%%=*}
    rest=${spec#*=}
    [[ -f "${rest%%,*}/libflashqla.so.0" ]] || { echo "${name}: no ${rest%%,*}/libflashqla.so.0"; exit 2; }
    names+=("${name}")
    envs[${name}]="LD_LIBRARY_PATH=$(cd "${rest%%,*}" && pwd)"
    [[ "${rest}" == *,* ]] && envs[${name}]+=" ${rest#*,}"
    envs[${name}]=${envs[${name}]//,/ }
    # A candidate whose tests differ (new cases, other kernel choices) brings its own binary.
    testers[${name}]=${tests}
    [[ -x "${rest%%,*}/flashqla_tests" ]] && testers[${name}]="${rest%%,*}/flashqla_tests"
  done
  local tested=" ${BWD_TESTS:-1} "
  tested=${tested//,/ }
  # Every candidate first runs one short case (a hang drops it from the timing,
  # the others go on), then, where BWD_TESTS names it, the backward GPU tests.
  local kept=()
  for name in "${names[@]}"; do
    if [[ -x "${testers[${name}]}" ]]; then
      env ${envs[${name}]} timeout 30 "${testers[${name}]}" --gtest_filter='Cuda/GpuBackward.MatchesCpuOracle/len65' \
        > "${out}/probe-${name}.log" 2>&1
      rc=$?
      if [[ ${rc} -eq 124 ]]; then
        echo "${name} hangs (its first case ran past 30 s): not timed"
        continue
      fi
    fi
    kept+=("${name}")
    if [[ "${tested}" != " 0 " && ( "${tested}" == " 1 " || "${tested}" == *" ${name} "* ) && -x "${testers[${name}]}" ]]; then
      env ${envs[${name}]} timeout 300 "${testers[${name}]}" \
        --gtest_filter='Cuda/GpuBackward.*:BackwardSupport.*:GpuBackwardPrep.*' > "${out}/tests-${name}.log" 2>&1
      echo "${name}: backward GPU tests rc $? $(grep -E '^\[  (PASSED|FAILED)' "${out}/tests-${name}.log" | tr '\n' ' ')"
    fi
  done
  [[ ${#kept[@]} -gt 0 ]] || { echo "no candidate left to time"; exit 1; }
  names=("${kept[@]}")
  for round in $(seq 1 "${BWD_ROUNDS:-2}"); do
    for name in "${names[@]}"; do
      env ${envs[${name}]} REPS=5 timeout 120 "${bin}" "${BWD_SHAPES:-0,1,2,4,5,7,8}" > "${out}/latency-${name}-${round}.log" 2>&1
    done
  done
  echo
  local metric card
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  # The backward's times, then the forward's on the same inputs (backward_latency
  # times both; a candidate that touches a kernel both use shows in each).
  for metric in bwd fwd; do
    for round in $(seq 1 "${BWD_ROUNDS:-2}"); do
      echo "round ${round}: $([[ ${metric} == bwd ]] && echo backward || echo forward) ms, ${card}"
      printf "%-22s" "shape"
      for name in "${names[@]}"; do printf " %10s" "${name}"; done
      echo
      local shapes
      mapfile -t shapes < <(awk '{print $1 "_" $2}' "${out}/latency-${names[0]}-${round}.log")
      local i
      for i in "${!shapes[@]}"; do
        printf "%-22s" "${shapes[$i]}"
        for name in "${names[@]}"; do
          printf " %10s" "$(awk -v row=$((i + 1)) -v m="${metric}" \
            'NR == row { for (f = 1; f < NF; ++f) if ($f == m) print $(f + 1) }' "${out}/latency-${name}-${round}.log")"
        done
        echo
      done
    done
  done
}

# --- bwd-iterate -------------------------------------------------------------
cmd_bwd_iterate() {
  local out="${OUT:-/tmp/flashqla-gpu-bwd-iterate}"
  mkdir -p "${out}"
  local build=build-gpu start variant rc
  local variants=(${BWD_GRADS:-})
  start=${SECONDS}
  fq_gpu_configure_and_build "${build}" "${out}" all backward_latency
  local build_s=$((SECONDS - start))
  local bin="${build}/benchmarks/tools/backward_latency"
  local tests
  tests=$(find "${build}" -name flashqla_tests -type f | head -n 1)
  local select="GpuBackward|gpu_backward|BackwardSupport"
  for variant in "${variants[@]}"; do
    # One short case first: a kernel that deadlocks would cost every test's timeout.
    FLASHQLA_BACKWARD_GRADS=${variant} timeout 30 "${tests}" \
      --gtest_filter='Cuda/GpuBackward.MatchesCpuOracle/len65' > "${out}/probe-${variant}.log" 2>&1
    rc=$?
    echo "grads ${variant}: first case rc ${rc}"
    grep -E "relative error|Failure" "${out}/probe-${variant}.log" | head -n 8
    [[ ${rc} -eq 124 ]] && { echo "grads ${variant} hangs"; exit 1; }
  done
  start=${SECONDS}
  ctest --test-dir "${build}" --output-on-failure --timeout 300 -j 4 -R "${select}" > "${out}/ctest.log" 2>&1
  local ctest_rc=$?
  for variant in "${variants[@]}"; do
    FLASHQLA_BACKWARD_GRADS=${variant} ctest --test-dir "${build}" --output-on-failure --timeout 300 -j 4 \
      -R "${select}" > "${out}/ctest-${variant}.log" 2>&1 || ctest_rc=1
    echo "grads ${variant}: $(grep -E "tests passed" "${out}/ctest-${variant}.log")"
  done
  local ctest_s=$((SECONDS - start))
  grep -hE "\*\*\*|Failed|Skipped" "${out}"/ctest*.log | head -n 30
  local round
  for round in $(seq 1 "${BWD_ROUNDS:-1}"); do
    REPS=5 timeout 120 "${bin}" "${BWD_SHAPES:-0,1,2,4,5}" > "${out}/latency-${round}.log" 2>&1
    for variant in "${variants[@]}"; do
      FLASHQLA_BACKWARD_GRADS=${variant} REPS=5 timeout 120 "${bin}" "${BWD_SHAPES:-0,1,2,4,5}" \
        > "${out}/latency-${variant}-${round}.log" 2>&1
    done
  done
  timeout 120 ncu --metrics gpu__time_duration.sum -k regex:gdn_bwd "${bin}" "${BWD_NCU_SHAPES:-0,4}" \
    > "${out}/ncu.log" 2>&1
  for variant in "${variants[@]}"; do
    FLASHQLA_BACKWARD_GRADS=${variant} timeout 120 ncu --metrics gpu__time_duration.sum -k regex:gdn_bwd "${bin}" \
      "${BWD_NCU_SHAPES:-0,4}" > "${out}/ncu-${variant}.log" 2>&1
  done
  echo
  echo "| step                     | result |"
  echo "|--------------------------|--------|"
  printf "| build (s)                | %6s |\n" "${build_s}"
  printf "| GPU backward tests (s, rc) | %3s %2s |\n" "${ctest_s}" "${ctest_rc}"
  printf "| tests total/skipped      | %3s %2s |\n" \
    "$(grep -oE "out of [0-9]+" "${out}/ctest.log" | grep -oE "[0-9]+" | tail -n 1)" "$(grep -c "(Skipped)" "${out}/ctest.log")"
  local log
  for log in "${out}"/ncu*.log; do
    echo "per kernel ($(basename "${log}" .log), shapes ${BWD_NCU_SHAPES:-0,4}, us or ms as printed):"
    grep -E "gdn_bwd|gpu__time_duration" "${log}" | paste - - | awk '{print "  " $1, $(NF-1), $NF}'
  done
  for log in "${out}"/latency*.log; do
    echo "== $(basename "${log}" .log)"
    cat "${log}"
  done
  [[ ${ctest_rc} -eq 0 ]]
}

# --- compare -----------------------------------------------------------------
# The versions to compare, as folder names in versions/ (exporting commits first
# where git can resolve them), in the order given; none: every exported version,
# in the order of versions/index.txt.
compare_versions() {
  local arg name
  if [[ $# -eq 0 ]]; then
    if [[ -f versions/index.txt ]]; then
      while read -r name _; do
        [[ -d "versions/${name}" ]] && echo "${name}"
      done < versions/index.txt
    else
      for name in versions/*/; do [[ -d "${name}" ]] && basename "${name}"; done
    fi
    return 0
  fi
  for arg in "$@"; do
    if [[ -d "versions/${arg}/src" ]]; then
      echo "${arg}"
    elif git rev-parse --verify -q "${arg}^{commit}" >/dev/null 2>&1; then
      mkdir -p versions
      fq_export_version "${arg}" | cut -d' ' -f1
    else
      echo "compare: ${arg} is neither a folder in versions/ nor a commit git knows here" \
        "(export it where the history is: scripts/export_versions.sh ${arg}, and carry versions/)" >&2
      return 1
    fi
  done
}

cmd_compare() {
  local quick=${COMPARE_QUICK:-0} wgmma_issue=${COMPARE_WGMMA_ISSUE:-0} refs=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --quick) quick=1 ;;
      --wgmma-issue) wgmma_issue=1 ;;
      -*) echo "usage: scripts/gpu.sh compare [--quick] [--wgmma-issue] [VERSION...]"; exit 2 ;;
      *) refs+=("$1") ;;
    esac
    shift
  done
  local list names=() name
  list=$(compare_versions "${refs[@]}") || exit 2
  [[ -n "${list}" ]] || { echo "compare: no versions (scripts/export_versions.sh REF..., carry versions/)"; exit 2; }
  mapfile -t names <<< "${list}"
  local out="${OUT:-/tmp/flashqla-compare}"
  mkdir -p "${out}"
  # A fresh build folder: every version's compile log is its build's.
  local build=build-compare trees=() targets=()
  local bin="${build}/benchmarks/tools" logs="${build}/benchmarks/tools/logs"
  rm -rf "${build}"
  for name in "${names[@]}"; do
    trees+=("${FLASHQLA_REPO_ROOT}/versions/${name}")
    targets+=("fused_timing-${name}")
  done
  [[ ${wgmma_issue} -eq 1 ]] && targets+=(wgmma_issue)
  local tree_list
  tree_list=$(IFS=';'; echo "${trees[*]}")
  (fq_gpu_configure "${build}" -DFLASHQLA_BUILD_TESTS=OFF -DFLASHQLA_BUILD_EXAMPLES=OFF \
    "-DFLASHQLA_TOOL_TREES=${tree_list}") > "${out}/configure.log" 2>&1 \
    || { tail -n 30 "${out}/configure.log"; echo "CONFIGURE FAILED"; exit 1; }
  fq_gpu_build "${build}" "${targets[@]}" > "${out}/build.log" 2>&1
  if [[ ${wgmma_issue} -eq 1 ]]; then
    { "${bin}/wgmma_issue" 2>&1 || tail -n 15 "${logs}/wgmma_issue.log"; } | tee "${out}/wgmma_issue.txt"
  fi
  local rounds=3 round
  [[ ${quick} -eq 1 ]] && rounds=1
  for name in "${names[@]}"; do
    [[ -x "${bin}/fused_timing-${name}" ]] && continue
    echo "=== ${name}: build failed:"; tail -n 15 "${logs}/fused_timing-${name}.log"
  done
  for round in $(seq 1 "${rounds}"); do
    for name in "${names[@]}"; do
      [[ -x "${bin}/fused_timing-${name}" ]] || continue
      echo "=== ${name} (round ${round}): $(grep "^${name} " versions/index.txt 2>/dev/null | cut -d' ' -f2-)"
      timeout 60 "${bin}/fused_timing-${name}" 2>&1 | grep -E "^B=|us per chunk|relative difference|error"
    done
  done | tee "${out}/compare.txt"
  echo
  python3 scripts/lib/compare_summary.py "${out}/compare.txt" | tee "${out}/summary.md"
}

# --- ncu ---------------------------------------------------------------------
cmd_ncu() {
  local shape=${NCU_SHAPE:-0} src=.
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --shape) shape=${2:?--shape needs a number}; shift ;;
      -*) echo "usage: scripts/gpu.sh ncu [--shape N] [VERSION-DIR]"; exit 2 ;;
      *) src=${1%/} ;;
    esac
    shift
  done
  local out="${OUT:-/tmp/flashqla-ncu}"
  mkdir -p "${out}"
  local build=build-ncu name=current tree="${FLASHQLA_REPO_ROOT}"
  if [[ "${src}" != . ]]; then
    tree=$(cd "${src}" && pwd) || exit 2
    name=$(basename "${tree}")
  fi
  local bin="${build}/benchmarks/tools/fused_timing-${name}"
  { (fq_gpu_configure "${build}" -DFLASHQLA_BUILD_TESTS=OFF -DFLASHQLA_BUILD_EXAMPLES=OFF \
      "-DFLASHQLA_TOOL_TREES=${tree}") && fq_gpu_build "${build}" "fused_timing-${name}"; } > "${out}/ncu-build.log" 2>&1 \
    || { tail -n 20 "${out}/ncu-build.log"; exit 1; }
  ncu --set full --clock-control none --import-source yes -k regex:gdn_fwd_fused -c 1 -o "${out}/prof" "${bin}" "${shape}" \
    > "${out}/ncu.log" 2>&1 || { tail -n 20 "${out}/ncu.log"; exit 1; }
  ncu -i "${out}/prof.ncu-rep" --page source --csv --print-source sass > "${out}/source.csv" 2>&1
  ncu -i "${out}/prof.ncu-rep" --page details --csv > "${out}/details.csv" 2>&1
  # The profiled binary's cubins (-lineinfo, the library's flags), for ncu_by_line.py --cubin.
  (cd "${out}" && cuobjdump -xelf all "${FLASHQLA_REPO_ROOT}/${bin}" > /dev/null 2>&1) \
    || echo "(cuobjdump failed: no cubins)"
  echo "ncu: ${out}/prof.ncu-rep, source.csv, details.csv, $(cd "${out}" && ls -- *.cubin 2>/dev/null | tr '\n' ' ')"
}

# --- ncu-bwd -----------------------------------------------------------------
cmd_ncu_bwd() {
  local shape=0 kernels=gdn_bwd_tc
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --shape) shape=${2:?--shape needs a number}; shift ;;
      --kernels) kernels=${2:?--kernels needs a regex}; shift ;;
      *) echo "usage: scripts/gpu.sh ncu-bwd [--shape N] [--kernels REGEX]"; exit 2 ;;
    esac
    shift
  done
  local out="${OUT:-/tmp/flashqla-ncu-bwd}" build=build-gpu
  mkdir -p "${out}"
  fq_gpu_configure_and_build "${build}" "${out}" backward_latency
  local bin="${build}/benchmarks/tools/backward_latency"
  # The first backward call's kernels (prep, chains, grads; NCU_COUNT to change).
  REPS=1 ncu --set full --clock-control none --import-source yes -k "regex:${kernels}" -c "${NCU_COUNT:-3}" \
    -o "${out}/bwd" "${bin}" "${shape}" > "${out}/ncu.log" 2>&1 || { tail -n 20 "${out}/ncu.log"; exit 1; }
  ncu -i "${out}/bwd.ncu-rep" --page details --csv > "${out}/details.csv" 2>&1
  ncu -i "${out}/bwd.ncu-rep" --page source --csv --print-source sass > "${out}/source.csv" 2>&1
  python3 - "${out}/details.csv" <<'PY'
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
want = ("Duration", "Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput", "Achieved Occupancy",
        "Registers Per Thread", "Dynamic Shared Memory Per Block", "Block Limit Shared Mem", "Grid Size",
        "Issue Slots Busy", "Executed Ipc Active", "L1/TEX Hit Rate", "L2 Hit Rate", "No Eligible")
by = collections.OrderedDict()
for r in rows:
    key = (r.get("ID"), r.get("Kernel Name", "")[:60])
    if r.get("Metric Name") in want or r.get("Section Name") in ("Warp State Statistics", "Scheduler Statistics"):
        by.setdefault(key, []).append(f"{r['Metric Name']}={r['Metric Value']}{r.get('Metric Unit', '')}")
for (i, name), vals in by.items():
    print(f"[{i}] {name}")
    for v in vals:
        print("    " + v)
PY
}

# --- h200-figures ------------------------------------------------------------
cmd_h200_figures() {
  local budget=${H200_FIGURES_SECONDS:-560} any_card=0 steps=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --budget) budget=${2:?--budget needs seconds}; shift ;;
      --any-card) any_card=1 ;;
      serving|check|sanitize|scale-long|scale-wide) steps+=("$1") ;;
      *) echo "usage: scripts/gpu.sh h200-figures [--budget S] [--any-card] [STEP...]"; exit 2 ;;
    esac
    shift
  done
  [[ ${#steps[@]} -gt 0 ]] || steps=(serving check scale-long)
  local card
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  if [[ ${any_card} -eq 0 && "${card}" != *H200* ]]; then
    echo "not an H200 (${card:-no GPU found}): no run"
    exit 3
  fi
  local out="${OUT:-benchmarks/results}" start=${SECONDS} step need left rc
  mkdir -p "${out}"
  for step in "${steps[@]}"; do
    # A step's usual seconds on the GPU machine (H100 runs), its command's limit the rest of the budget.
    case "${step}" in
      serving) need=200 ;; check) need=420 ;; sanitize) need=300 ;; scale-long) need=240 ;; scale-wide) need=300 ;;
    esac
    left=$((budget - (SECONDS - start)))
    if [[ ${need} -gt ${left} ]]; then
      echo "== ${step}: skipped (about ${need} s, ${left} s left)"
      continue
    fi
    echo "== ${step} (${card})"
    case "${step}" in
      serving) OUT="${out}" timeout "${left}" bash "${FQ_GPU_SELF}" bench-serving | tail -n 12 ;;
      check) OUT="${out}/check" timeout "${left}" bash "${FQ_GPU_SELF}" check --cpp-only | tail -n 8 ;;
      sanitize) OUT="${out}/check" timeout "${left}" bash "${FQ_GPU_SELF}" sanitize | tail -n 4 ;;
      scale-long) OUT="${out}" timeout "${left}" bash "${FQ_GPU_SELF}" scale --cases oom,long | tail -n 12 ;;
      scale-wide) OUT="${out}" timeout "${left}" bash "${FQ_GPU_SELF}" scale --cases wide | tail -n 12 ;;
    esac
    rc=${PIPESTATUS[0]}
    echo "== ${step}: rc ${rc} after $((SECONDS - start)) s"
  done
}

# --- sanitize ----------------------------------------------------------------
cmd_sanitize() {
  local out="${OUT:-/tmp/flashqla-sanitize}" build=build-gpu
  mkdir -p "${out}"
  [[ -x "${build}/tests/flashqla_tests" ]] || fq_gpu_configure_and_build "${build}" "${out}"
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  # Cases of the C++ GPU suites that reach every kernel: the backward's (tensor
  # cores and simple; its chains by sequence pieces with their scan, both
  # lists), and the forward's fused kernel, simple kernel, piece passes with the
  # piece scan, and chained pieces. memcheck and initcheck take the wider list;
  # racecheck and synccheck, far slower, the short one.
  local bwd=Cuda/GpuBackward.MatchesCpuOracle fwd=Cuda/GpuForward.MatchesCpuOracle
  local wide="${bwd}/varlen_with_empty:${bwd}/K100_V200:${bwd}/strided_views:${bwd}/l2norm_in_kernel:${bwd}/gqa3"
  wide+=":${bwd}/varlen_many_pieces1_chains16"
  wide+=":${fwd}/len65:${fwd}/varlen_with_empty:${fwd}/K100_V200:${fwd}/piece_passes_varlen_with_empty"
  wide+=":${fwd}/chained_pieces_varlen_with_empty:${fwd}/l2norm_in_kernel"
  local short="${bwd}/len1:${bwd}/len65:${bwd}/len300:${bwd}/varlen_many:${bwd}/varlen_many_pieces1_chains16"
  short+=":${fwd}/len65:${fwd}/K64_V64:${fwd}/piece_passes_varlen_with_empty"
  short+=":${fwd}/chained_pieces_varlen_with_empty"
  local tool filter rc status=0 verdicts=()
  for tool in memcheck initcheck racecheck synccheck; do
    filter=${short}
    [[ ${tool} == memcheck || ${tool} == initcheck ]] && filter=${wide}
    "${sanitizer}" --tool "${tool}" --error-exitcode 9 "${build}/tests/flashqla_tests" --gtest_filter="${filter}" \
      > "${out}/sanitize-${tool}.log" 2>&1
    rc=$?
    # memcheck, initcheck and synccheck end with "ERROR SUMMARY: 0 errors",
    # racecheck with "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)".
    if [[ ${rc} -eq 0 ]] && grep -qE "(ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards displayed \(0 errors, 0 warnings\))" \
         "${out}/sanitize-${tool}.log" && ! grep -q "FAILED" "${out}/sanitize-${tool}.log"; then
      verdicts+=("${tool} clean")
    else
      verdicts+=("${tool} FAILED (rc ${rc})")
      status=1
      tail -n 30 "${out}/sanitize-${tool}.log"
    fi
  done
  echo "sanitizers on the forward and backward kernels: ${verdicts[*]}"
  return ${status}
}

command=${1:-}
[[ $# -gt 0 ]] && shift
case "${command}" in
  check) cmd_check "$@" ;;
  bench) cmd_bench "$@" ;;
  bench-bwd) cmd_bench_bwd "$@" ;;
  bench-serving) cmd_bench_serving "$@" ;;
  scale) cmd_scale "$@" ;;
  bench-cp) cmd_bench_cp "$@" ;;
  full) cmd_full "$@" ;;
  iterate) cmd_iterate "$@" ;;
  bwd-iterate) cmd_bwd_iterate "$@" ;;
  bwd-compare) cmd_bwd_compare "$@" ;;
  compare) cmd_compare "$@" ;;
  ncu) cmd_ncu "$@" ;;
  ncu-bwd) cmd_ncu_bwd "$@" ;;
  h200-figures) cmd_h200_figures "$@" ;;
  sanitize) cmd_sanitize "$@" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
