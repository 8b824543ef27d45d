# Shared steps of scripts/gpu.sh (the GPU machine's driver). Source it after
# scripts/lib/build.sh; do not run it. The GPU machine reaches no package
# registry: what it needs comes carried (third_party/ and .whl/ from
# scripts/prepare_device.sh, versions/ from scripts/export_versions.sh, a Triton
# cache as .triton-cache.tar.xz).

# fq_gpu_configure <build dir> [extra CMake arguments...]: configures the
# library's CMake project with the CUDA backend, exactly as scripts/run_tests.sh
# does (scripts/lib/build.sh: the library's flags, Release), plus GoogleTest's
# carried sources and the development tools (benchmarks/tools/, built only when
# named). Ninja when present and the folder is new. Output to stdout.
fq_gpu_configure() {
  local dir=$1
  shift
  FLASHQLA_BUILD_DIR="${FLASHQLA_REPO_ROOT}/${dir}"
  FLASHQLA_ENABLE_CUDA=ON
  FLASHQLA_FETCH_CUTLASS=0
  fq_detect_cuda
  local extra=()
  if [[ ! -f "${FLASHQLA_BUILD_DIR}/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
    extra+=(-G Ninja)
  fi
  fq_configure "${extra[@]}" -DFLASHQLA_GTEST_SOURCE_DIR="${FLASHQLA_REPO_ROOT}/third_party/googletest" \
    -DFLASHQLA_BUILD_TOOLS=ON "$@"
}

# fq_gpu_build <build dir> [targets...]: builds the targets (default: all) with
# every core, and with targets named, keeps going past a target that fails to
# build, so that the others are still built (each version of a comparison).
fq_gpu_build() {
  local dir=$1
  shift
  local args=(--build "${FLASHQLA_REPO_ROOT}/${dir}" -j "${FLASHQLA_JOBS}")
  if [[ $# -gt 0 ]]; then
    args+=(--target "$@" --)
    if grep -q "^CMAKE_GENERATOR:INTERNAL=Ninja" "${FLASHQLA_REPO_ROOT}/${dir}/CMakeCache.txt"; then
      args+=(-k 0)
    else
      args+=(-k)
    fi
  fi
  cmake "${args[@]}"
}

# fq_gpu_configure_and_build <build dir> <log dir> [targets...]: both steps above,
# logs in configure.log and build.log; on failure prints their tails and exits.
fq_gpu_configure_and_build() {
  local dir=$1 logs=$2
  shift 2
  if ! { (fq_gpu_configure "${dir}") > "${logs}/configure.log" 2>&1 \
         && fq_gpu_build "${dir}" "$@" > "${logs}/build.log" 2>&1; }; then
    tail -n 60 "${logs}/configure.log" "${logs}/build.log"
    echo "BUILD FAILED"
    exit 1
  fi
}

# fq_gpu_probe <build dir> <log dir>: runs one small GPU forward test with a
# short timeout and exits the script if it fails or hangs — a kernel that
# deadlocks (a named barrier, setmaxnreg) would otherwise cost every test's
# timeout of the suite that follows.
fq_gpu_probe() {
  if ! ctest --test-dir "$1" --no-tests=error --timeout 30 -R 'GpuForward.MatchesCpuOracle/len1$' \
    > "$2/probe.log" 2>&1; then
    tail -n 20 "$2/probe.log"
    echo "FIRST GPU FORWARD FAILED OR HUNG (see probe.log)"
    exit 1
  fi
}

# fq_install_wheels <log>: the carried wheels (.whl/: FLA 0.5.2, HF transformers
# and what they need) into the machine's Python, without an index.
fq_install_wheels() {
  if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps .whl/*.whl > "$1" 2>&1
  fi
}

# A hash of the sources the Python package is built from, the same on this
# machine and on the one that built a wheel (scripts/build_wheel.sh records it).
fq_source_hash() {
  (cd "${FLASHQLA_REPO_ROOT}" &&
    find src include binding python cmake CMakeLists.txt pyproject.toml \( -name __pycache__ -o -name '*.egg-info' \) \
      -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-16
}

# fq_install_flashqla <log>: the package into the machine's python3: the wheel
# scripts/build_wheel.sh left in .whl/flashqla/ when it was built from these
# very sources (seconds), else `pip install .` (the core's sm_90a kernels and the
# binding built here: minutes). The log says which.
fq_install_flashqla() {
  local wheel
  wheel=$(compgen -G ".whl/flashqla/*.whl" | head -n 1)
  if [[ -n "${wheel}" && "$(cat .whl/flashqla/SOURCE 2>/dev/null)" == "$(fq_source_hash)" ]]; then
    echo "flashqla: the prebuilt ${wheel}" > "$1"
    python3 -m pip install -q --no-index --no-deps --force-reinstall "${wheel}" >> "$1" 2>&1
  else
    echo "flashqla: built here (pip install .)${wheel:+; ${wheel} was built from other sources}" > "$1"
    python3 -m pip install -q --no-index . >> "$1" 2>&1
  fi
}

# FLA's Triton compile cache. It comes back from a benchmark run as
# triton-cache.tar.xz.part-* (fq_save_triton_cache); joined here into
# .triton-cache.tar.xz (`cat parts > .triton-cache.tar.xz`), it is small enough
# to carry with the next call (the unpacked cache is ≈ 200 MB), and
# fq_use_triton_cache unpacks it into .triton-cache/, which TRITON_CACHE_DIR
# then points at.
fq_use_triton_cache() {
  if [[ ! -d .triton-cache && -f .triton-cache.tar.xz ]]; then
    mkdir -p .triton-cache && tar -xJf .triton-cache.tar.xz -C .triton-cache
  fi
  if [[ -d .triton-cache ]]; then
    export TRITON_CACHE_DIR="${PWD}/.triton-cache"
  else
    export TRITON_CACHE_DIR="${HOME}/.triton/cache"  # Triton's default
    mkdir -p "${TRITON_CACHE_DIR}"
  fi
}

# fq_save_triton_cache <out dir>: the cache as <out>/triton-cache.tar.xz.part-aa,
# -ab, ... (15 MiB pieces, at most four, so that the files stay few and small),
# left out when larger.
fq_save_triton_cache() {
  local cache_tar
  cache_tar=$(mktemp)
  if XZ_OPT=-T0 tar -cJf "${cache_tar}" -C "${TRITON_CACHE_DIR}" . 2>/dev/null \
      && [[ $(stat -c %s "${cache_tar}") -le $((60 << 20)) ]]; then
    split -b $((15 << 20)) "${cache_tar}" "$1/triton-cache.tar.xz.part-"
  fi
  rm -f "${cache_tar}"
}

# fq_export_version <ref>: exports commit <ref>'s include/, src/ and
# benchmarks/tools/ into versions/<short hash>/ and records it in
# versions/index.txt; prints the index line ("<name> <subject>"). Needs git and
# the history (run it here, and carry versions/ to the GPU machine).
fq_export_version() {
  local ref=$1 name line
  name=$(git rev-parse --short "${ref}^{commit}") || return 1
  rm -rf "versions/${name}"
  mkdir -p "versions/${name}"
  git archive "${ref}" include src benchmarks/tools | tar -x -C "versions/${name}" || return 1
  line="${name} $(git log -1 --format=%s "${ref}" | cut -c1-80)"
  if [[ -f versions/index.txt ]]; then
    grep -v "^${name} " versions/index.txt > versions/index.txt.new || true
    mv versions/index.txt.new versions/index.txt
  fi
  echo "${line}" | tee -a versions/index.txt
}
