// The scan between the two piece passes of the sequence-parallel forward: for
// each (sequence, value head) it chains the pieces' end states and transitions
// into every piece's true start state (forward_args.h).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/forward_args.h"

namespace flashqla::cuda {

// Enqueues the scan on `stream`; args.piece_* describe the pieces.
cudaError_t launch_gdn_fwd_piece_scan(const ForwardArgs& args, cudaStream_t stream);

}  // namespace flashqla::cuda
