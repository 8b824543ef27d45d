// The tensor-core forward for K = V = 128 with bf16 / fp16 tokens: one CTA per
// (sequence, value head) work item, longest sequences first, the state held in
// fp32 registers across the chunk loop, every GEMM of a chunk on wgmma (two
// warpgroups) but the inverse's small blocks (mma.sync), the next chunk's
// q/k/v streamed in by cp.async while the current one computes.
// docs/perf.md logs its versions; docs/design.md describes the algorithm.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/forward_args.h"

namespace flashqla::cuda {

// Whether the fused kernel covers this call (sizes, dtypes, alignment); the
// simple kernel runs everything else.
bool fused_forward_supports(const ForwardArgs& args);

// Enqueues the forward on `stream`; returns the launch status.
cudaError_t launch_gdn_fwd_fused(const ForwardArgs& args, cudaStream_t stream);

}  // namespace flashqla::cuda
