set -x
nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -lineinfo -Iinclude -Isrc -Ithird_party/cutlass/include benchmarks/tools/fused_phase_profile.cu src/cuda/sm90/gdn_fwd_simple_sm90.cu -o /tmp/ft > /dev/null 2>&1 || exit 1
ncu --set full --import-source yes -k regex:gdn_fwd_fused -c 1 -o $OUT/prof /tmp/ft > $OUT/ncu.log 2>&1
tail -3 $OUT/ncu.log
ncu -i $OUT/prof.ncu-rep --page source --csv --print-source sass > $OUT/source.csv 2>&1
ncu -i $OUT/prof.ncu-rep --page details --csv > $OUT/details.csv 2>&1
ls -la $OUT
