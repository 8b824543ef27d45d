// The simple backward: every shape, dtype and option the API accepts, in
// fp32 on CUDA cores (the reference the tensor-core backward is checked
// against on the GPU, and the path for what it does not cover).
//
// Two launches. The chain kernel runs one CTA per (sequence, value head,
// V tile): the forward's state chain, storing each chunk's start state in the
// workspace, then the gradient chain from the last chunk back, computing per
// chunk dv (whole: it is per value column) and the tile's share of dq, dk, dβ
// and dγ (sums over V) into per-tile partials. The finish kernel sums the
// partials over V tiles and each GQA group in a fixed order (deterministic, no
// atomics) and applies the l2norm and beta-activation backward.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/backward_args.h"

namespace flashqla::cuda {

// The workspace of one simple backward call, in bytes from its start.
struct SimpleBackwardLayout {
  int v_tile = 0;           // value columns a CTA (32, 16, 8 or 4: what fits in shared memory with K)
  int64_t v_tiles = 0;      // ceil(V / v_tile)
  int64_t chunk_slots = 0;  // chunk-start-state slots per value head (an upper bound on all sequences' chunks)
  size_t states = 0;        // offset of [chunk_slots][HV][K][V] fp32
  size_t partials = 0;      // offset of [v_tiles][B T][HV][2 K + 2] fp32
  size_t bytes = 0;         // total, from offset 0
};

// Layout after `offset` bytes the caller keeps for itself (16-byte aligned);
// max_smem_bytes is the device's opt-in shared memory per block.
SimpleBackwardLayout simple_backward_layout(int64_t B, int64_t T, int64_t N, int64_t HV, int64_t K, int64_t V,
                                            bool varlen, size_t offset, size_t max_smem_bytes);

// Launches both kernels on `stream` (args.chunk_states, args.partials set from
// the layout).
cudaError_t launch_gdn_bwd_simple(const BackwardArgs& args, int v_tile, cudaStream_t stream);

}  // namespace flashqla::cuda
