# Sourced by the device scripts: FLA's Triton compile cache. It comes back from a
# run as triton-cache.tar.xz.part-* (gpu_bench.sh); joined here into
# .triton-cache.tar.xz (`cat parts > .triton-cache.tar.xz`), it is small enough
# to carry with the next call (the unpacked cache is ≈ 200 MB) and is unpacked on
# the device into .triton-cache/, which TRITON_CACHE_DIR then points at.
fq_use_triton_cache() {
  if [[ ! -d .triton-cache && -f .triton-cache.tar.xz ]]; then
    mkdir -p .triton-cache && tar -xJf .triton-cache.tar.xz -C .triton-cache
  fi
  if [[ -d .triton-cache ]]; then
    export TRITON_CACHE_DIR="${PWD}/.triton-cache"
  else
    export TRITON_CACHE_DIR="${HOME}/.triton/cache"  # Triton's default
    mkdir -p "${TRITON_CACHE_DIR}"
  fi
}
