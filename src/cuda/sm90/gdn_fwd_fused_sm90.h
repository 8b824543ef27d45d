// The tensor-core forward for K = V = 128 with bf16 / fp16 tokens: one CTA per
// work item (a sequence, or a piece of one, and a value head; whole sequences
// longest first). Three warpgroups: two hold the state in fp32 registers and run
// its chain through the chunks (V_new = Tβ (V − e^γ ⊙ K S), O and the state
// update, all on wgmma: gdn_fwd_fused/state_chain.cuh); the third loads chunk
// c + 1 by TMA and computes its A, T = (I + A)⁻¹, Tβ = T diag(β) and
// P = Q Kᵀ ⊙ Γ while the chain runs chunk c (gdn_fwd_fused/chunk_producer.cuh).
// docs/design.md §5.1 describes it part by part; docs/perf.md is its record.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/forward_args.h"

namespace flashqla::cuda {

// Enqueues the forward on `stream` for a call that fused_forward_supports
// (cuda/fused_forward_support.h) accepts; returns the launch status.
cudaError_t launch_gdn_fwd_fused(const ForwardArgs& args, cudaStream_t stream);

}  // namespace flashqla::cuda
