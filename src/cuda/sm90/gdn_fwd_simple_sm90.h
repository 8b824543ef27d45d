// The simple CUDA forward: one CTA per (sequence, value head, 32-wide V tile),
// the chunked algorithm in fp32 with plain FMA arithmetic and the gated
// inverse. Correct for every supported shape and dtype (K, V <= 256); it runs
// the shapes the fused kernel does not cover and serves as a GPU-side
// reference for it. Not tuned.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/forward_args.h"

namespace flashqla::cuda {

// Enqueues the forward on `stream`; returns the launch status.
cudaError_t launch_gdn_fwd_simple(const ForwardArgs& args, cudaStream_t stream);

}  // namespace flashqla::cuda
