# Shared setup, configure and build steps for scripts/run_tests.sh (everything),
# scripts/run_demo.sh (a CPU-only tree with the one example) and scripts/gpu.sh
# (the GPU machine's builds: the same configure, with its own build folders and
# extra CMake arguments). Source it; do not run it.
#
# Environment knobs:
#   FLASHQLA_BUILD_DIR     build folder of run_tests.sh (default: <repo>/build)
#   FLASHQLA_DEMO_BUILD_DIR  build folder of run_demo.sh (default: <repo>/build-demo;
#                          CPU only, no tests, only the example it runs)
#   FLASHQLA_BUILD_TYPE    CMAKE_BUILD_TYPE (default: Release)
#   FLASHQLA_ENABLE_CUDA   ON / OFF to force the CUDA backend on or off
#                          (default: ON exactly when nvcc is found)
#   FLASHQLA_JOBS          parallel build / test jobs (default: nproc)
#   FLASHQLA_SKIP_APT=1    never install system packages, only check
#   FLASHQLA_FETCH_CUTLASS=0  do not run scripts/fetch_cutlass.sh before a CUDA
#                          configure (a machine that reaches no package registry,
#                          with third_party/ carried; CMake stops with a clear
#                          message when the headers are missing)

FLASHQLA_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
FLASHQLA_BUILD_DIR="${FLASHQLA_BUILD_DIR:-${FLASHQLA_REPO_ROOT}/build}"
FLASHQLA_DEMO_BUILD_DIR="${FLASHQLA_DEMO_BUILD_DIR:-${FLASHQLA_REPO_ROOT}/build-demo}"
FLASHQLA_BUILD_TYPE="${FLASHQLA_BUILD_TYPE:-Release}"
FLASHQLA_JOBS="${FLASHQLA_JOBS:-$(nproc 2>/dev/null || echo 2)}"

fq_log() { printf '==> %s\n' "$*"; }
fq_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# fq_pkg_missing <package> [command]: true when dpkg does not list the package
# as installed and (if given) the command is not on PATH either.
fq_pkg_missing() {
  local pkg="$1" cmd="${2:-}"
  if [[ -n "${cmd}" ]] && command -v "${cmd}" >/dev/null 2>&1; then
    return 1
  fi
  if command -v dpkg >/dev/null 2>&1 &&
     dpkg -s "${pkg}" 2>/dev/null | grep -q '^Status: install ok installed'; then
    return 1
  fi
  return 0
}

# Installs cmake, make, g++, GoogleTest and GoogleMock with apt-get, only those
# missing. --no-gtest: cmake, make and g++ only (a build without the tests).
fq_install_prerequisites() {
  local wanted=(cmake make g++) missing=()
  fq_pkg_missing cmake cmake && missing+=(cmake)
  fq_pkg_missing make make && missing+=(make)
  fq_pkg_missing g++ g++ && missing+=(g++)
  if [[ "${1:-}" != "--no-gtest" ]]; then
    wanted+=(libgtest-dev libgmock-dev)
    fq_pkg_missing libgtest-dev && missing+=(libgtest-dev)
    fq_pkg_missing libgmock-dev && missing+=(libgmock-dev)
  fi
  if [[ ${#missing[@]} -eq 0 ]]; then
    fq_log "prerequisites present (${wanted[*]})"
    return 0
  fi
  if [[ "${FLASHQLA_SKIP_APT:-0}" == "1" ]]; then
    fq_die "missing packages: ${missing[*]} (FLASHQLA_SKIP_APT=1, not installing)"
  fi
  command -v apt-get >/dev/null 2>&1 ||
    fq_die "missing packages: ${missing[*]}, and apt-get is not available to install them"
  local sudo=()
  if [[ "$(id -u)" != "0" ]]; then
    command -v sudo >/dev/null 2>&1 ||
      fq_die "missing packages: ${missing[*]}; run as root or install sudo"
    sudo=(sudo)
  fi
  fq_log "installing missing packages: ${missing[*]}"
  "${sudo[@]}" apt-get update
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
}

# Sets FLASHQLA_CUDA=ON/OFF and, with ON, FLASHQLA_NVCC.
fq_detect_cuda() {
  FLASHQLA_NVCC="$(command -v nvcc 2>/dev/null || true)"
  if [[ -z "${FLASHQLA_NVCC}" && -x /usr/local/cuda/bin/nvcc ]]; then
    FLASHQLA_NVCC=/usr/local/cuda/bin/nvcc
  fi
  if [[ -n "${FLASHQLA_ENABLE_CUDA:-}" ]]; then
    FLASHQLA_CUDA="${FLASHQLA_ENABLE_CUDA}"
  elif [[ -n "${FLASHQLA_NVCC}" ]]; then
    FLASHQLA_CUDA=ON
  else
    FLASHQLA_CUDA=OFF
  fi
  case "${FLASHQLA_CUDA}" in
    ON|on|1|TRUE|true) FLASHQLA_CUDA=ON ;;
    *) FLASHQLA_CUDA=OFF ;;
  esac
  if [[ "${FLASHQLA_CUDA}" == "ON" ]]; then
    [[ -n "${FLASHQLA_NVCC}" ]] || fq_die "FLASHQLA_ENABLE_CUDA=ON but nvcc was not found"
    fq_log "CUDA: $("${FLASHQLA_NVCC}" --version | tail -n 1 | sed 's/^ *//') (${FLASHQLA_NVCC}); building the sm_90a kernels"
  else
    fq_log "CUDA: nvcc not found (or disabled); building the CPU backend only, the sm_90a kernels are skipped"
  fi
}

# fq_configure [extra CMake arguments...]: configures FLASHQLA_BUILD_DIR (after
# fq_detect_cuda); the extra arguments come last, so they may override the
# defaults (-DFLASHQLA_BUILD_TESTS=OFF, ...).
fq_configure() {
  local args=(-S "${FLASHQLA_REPO_ROOT}" -B "${FLASHQLA_BUILD_DIR}"
              "-DCMAKE_BUILD_TYPE=${FLASHQLA_BUILD_TYPE}"
              "-DFLASHQLA_ENABLE_CUDA=${FLASHQLA_CUDA}"
              -DFLASHQLA_BUILD_TESTS=ON
              -DFLASHQLA_BUILD_EXAMPLES=ON)
  if [[ "${FLASHQLA_CUDA}" == "ON" ]]; then
    if [[ "${FLASHQLA_FETCH_CUTLASS:-1}" != "0" ]]; then
      bash "${FLASHQLA_REPO_ROOT}/scripts/fetch_cutlass.sh"
    fi
    args+=("-DCMAKE_CUDA_COMPILER=${FLASHQLA_NVCC}")
  fi
  fq_log "configuring ${FLASHQLA_BUILD_DIR}"
  cmake "${args[@]}" "$@"
}

fq_build() {
  fq_log "building with ${FLASHQLA_JOBS} jobs"
  cmake --build "${FLASHQLA_BUILD_DIR}" -j "${FLASHQLA_JOBS}"
}

# The demo's tree: the core and the CPU backend (the demo runs on the CPU
# backend, so no CUDA check, CUTLASS or sm_90a kernels), no test suite (no
# GoogleTest), and of the examples only gdn_forward_cpu, the one it runs.
fq_setup_and_build_demo() {
  cd "${FLASHQLA_REPO_ROOT}"
  fq_install_prerequisites --no-gtest
  fq_log "configuring ${FLASHQLA_DEMO_BUILD_DIR} (CPU backend only, no tests)"
  cmake -S "${FLASHQLA_REPO_ROOT}" -B "${FLASHQLA_DEMO_BUILD_DIR}" \
        "-DCMAKE_BUILD_TYPE=${FLASHQLA_BUILD_TYPE}" \
        -DFLASHQLA_ENABLE_CUDA=OFF \
        -DFLASHQLA_BUILD_TESTS=OFF \
        -DFLASHQLA_BUILD_EXAMPLES=ON
  fq_log "building gdn_forward_cpu with ${FLASHQLA_JOBS} jobs"
  cmake --build "${FLASHQLA_DEMO_BUILD_DIR}" --target gdn_forward_cpu -j "${FLASHQLA_JOBS}"
}

# Everything up to a built tree.
fq_setup_and_build() {
  cd "${FLASHQLA_REPO_ROOT}"
  fq_install_prerequisites
  fq_detect_cuda
  fq_configure
  fq_build
}
