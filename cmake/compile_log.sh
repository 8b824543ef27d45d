#!/usr/bin/env bash
# Compiler launcher of the development tools (benchmarks/tools/CMakeLists.txt):
#   compile_log.sh <log file> <compiler> [arguments...]
# runs the compile command, passes on everything it prints, and also appends it
# to <log file>, so that each tool target has its own compile log (ptxas's spill
# reports and serialization advisories, C7512/C7514/C7520, name no target);
# exits with the command's exit status.
set -u -o pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 <log file> <compiler> [arguments...]" >&2
  exit 2
fi
log=$1
shift
mkdir -p "$(dirname "${log}")"
"$@" 2>&1 | tee -a "${log}"
