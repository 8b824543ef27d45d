#!/usr/bin/env bash
# Run here: exports the kernel sources of several commits into the ignored
# versions/ folder (versions/<name>/{include,src,benchmarks/tools}), for
# scripts/gpu_compare_versions.sh to time them all in one GPU call.
#   scripts/export_versions.sh main wip-branch~2 wip-branch
# A version's name is its commit's short hash.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
rm -rf versions
mkdir -p versions
for ref in "$@"; do
  name=$(git rev-parse --short "${ref}")
  mkdir -p "versions/${name}"
  git archive "${ref}" include src benchmarks/tools | tar -x -C "versions/${name}"
  echo "${name} $(git log -1 --format=%s "${ref}" | cut -c1-80)" | tee -a versions/index.txt
done
