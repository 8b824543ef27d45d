# The results' file stem for this machine's GPU, as benchmarks/bench_fwd.py
# names them: h200, h100, or gpu for any other card (or none found).
fq_card_name() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  case "${name}" in
    *H200*) echo h200 ;;
    *H100*) echo h100 ;;
    *) echo gpu ;;
  esac
}
