#!/usr/bin/env bash
# Set up and run the main job: the CPU-backend GDN forward example
# (examples/gdn_forward_cpu.c). Installs what is missing of cmake, make and g++,
# then configures build-demo/ for the CPU backend only, without the test suite,
# and builds just that example (build-demo/examples/gdn_forward_cpu); the full
# build with the tests and the sm_90a kernels is scripts/run_tests.sh's.
# Extra arguments go to the example, e.g. --algorithm recurrent --threads 2.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/build.sh"

fq_setup_and_build_demo

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu_note="a GPU is present, but this demo runs on the CPU backend"
else
  gpu_note="no GPU on this machine: the demo runs on the CPU backend"
fi
fq_log "running gdn_forward_cpu (${gpu_note})"
"${FLASHQLA_DEMO_BUILD_DIR}/examples/gdn_forward_cpu" "$@"
