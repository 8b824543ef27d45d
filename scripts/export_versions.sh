#!/usr/bin/env bash
# Run here: exports the kernel sources of several commits into the ignored
# versions/ folder (versions/<name>/{include,src,benchmarks/tools}), for
# `scripts/gpu.sh compare` to time them all in one GPU call.
#   scripts/export_versions.sh main wip-branch~2 wip-branch
# A version's name is its commit's short hash.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/gpu_common.sh
rm -rf versions
mkdir -p versions
for ref in "$@"; do
  fq_export_version "${ref}"
done
