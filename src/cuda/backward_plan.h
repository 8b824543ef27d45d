// One backward call on the CUDA backend, planned once: which backward runs
// (the tensor-core one where backward_support.h says it covers the call), why
// not, and its workspace layout. The workspace query and the launch read the
// same plan.
#pragma once

#include <cstddef>
#include <string>

#include "cuda/backward_args.h"
#include "cuda/sm90/gdn_bwd_simple_sm90.h"
#include "cuda/sm90/gdn_bwd_tc_sm90.h"

namespace flashqla::cuda {

struct BackwardPlan {
  BackwardArgs args;   // the call's tensors (workspace pointers set at launch)
  bool tensor_core = false;
  std::string reason;  // why not the tensor-core backward ("" when it runs)
  SimpleBackwardLayout simple;
  TensorCoreBackwardLayout tc;
  int chain_columns = 32;  // the tensor-core chains' value columns a CTA (chains_value_columns)
  bool grads_beside = false;  // the grads kernel beside the chains (grads_beside_chains)
  int64_t piece_chunks = 0;   // the chains' sequence pieces: chunks a piece (0: whole sequences)
  int64_t max_pieces = 0;     // pieces a sequence at most
  size_t bytes = 0;    // workspace: the debug check word, then the chosen backward's arrays
};

}  // namespace flashqla::cuda
