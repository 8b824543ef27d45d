// Before a chained-pieces launch of the fused forward: zeroes the ticket and the
// chains' counters and writes the ticket table (ticket -> round, place in the
// round) from cu_seqlens on the device (work_scheduler.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/forward_args.h"

namespace flashqla::cuda {

// Enqueues the table's kernel on `stream`; args.piece_* and args.chain_* describe the pieces.
cudaError_t launch_gdn_fwd_chain_tickets(const ForwardArgs& args, cudaStream_t stream);

}  // namespace flashqla::cuda
