# The first GPU step of scripts/gpu_check.sh and scripts/gpu_iterate.sh. Source
# it; do not run it.
#
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
