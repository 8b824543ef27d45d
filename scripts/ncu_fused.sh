#!/usr/bin/env bash
# On the GPU machine: Nsight Compute profile of the fused forward kernel (first
# launch of benchmarks/tools/fused_phase_profile.cu; by default its shape 0, one
# sequence of 8192 tokens, NCU_SHAPE=2 the 256-chain shape at full load), with
# source-level stall sampling and shared-memory wavefronts per SASS instruction.
# Writes prof.ncu-rep, source.csv and details.csv to $OUT. Needs third_party/
# from scripts/prepare_device.sh. An argument profiles the
# sources of a version exported by scripts/export_versions.sh instead
# (scripts/ncu_fused.sh versions/<name>/). benchmarks/tools/ncu_by_line.py sums
# source.csv by source line (here, with a -lineinfo cubin of the same sources).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-/tmp/flashqla-ncu}"
mkdir -p "${out}"
src="${1:-.}"
src="${src%/}"
nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo -I"${src}/include" -I"${src}/src" -Ithird_party/cutlass/include \
  benchmarks/tools/fused_phase_profile.cu "${src}/src/cuda/sm90/gdn_fwd_simple_sm90.cu" -o /tmp/fused_ncu > "${out}/ncu-build.log" 2>&1 \
  || { tail -n 20 "${out}/ncu-build.log"; exit 1; }
ncu --set full --clock-control none --import-source yes -k regex:gdn_fwd_fused -c 1 -o "${out}/prof" /tmp/fused_ncu "${NCU_SHAPE:-0}" > "${out}/ncu.log" 2>&1 \
  || { tail -n 20 "${out}/ncu.log"; exit 1; }
ncu -i "${out}/prof.ncu-rep" --page source --csv --print-source sass > "${out}/source.csv" 2>&1
ncu -i "${out}/prof.ncu-rep" --page details --csv > "${out}/details.csv" 2>&1
echo "ncu: ${out}/prof.ncu-rep, source.csv, details.csv"
