// The CPU backend: the whole C API computed on the host in fp64, threads over
// (sequence, head). Gathers strided tensors of any supported dtype into
// dense fp64 per-head problems (head_problem.h), runs the recurrent or the
// chunked algorithm, and writes the results back in the outputs' dtypes.
#pragma once

#include "core/problem.h"

namespace flashqla::cpu {

void gdn_forward(const Problem& problem, const flashqla_gdn_fwd_params_t& params);
void gdn_backward(const Problem& problem, const flashqla_gdn_bwd_params_t& params);

}  // namespace flashqla::cpu
