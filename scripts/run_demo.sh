#!/usr/bin/env bash
# Set up and run the main job: the same setup and build as run_tests.sh, then
# the CPU-backend GDN forward example (build/examples/gdn_forward_cpu).
# Extra arguments go to the example, e.g. --algorithm recurrent --threads 2.
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib/build.sh"

fq_setup_and_build

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpu_note="a GPU is present, but this demo runs on the CPU backend"
else
  gpu_note="no GPU on this machine: the demo runs on the CPU backend"
fi
fq_log "running gdn_forward_cpu (${gpu_note})"
"${FLASHQLA_BUILD_DIR}/examples/gdn_forward_cpu" "$@"
