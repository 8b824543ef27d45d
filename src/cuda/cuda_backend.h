// The CUDA backend's host side: device checks, workspace layout and kernel
// launches on the caller's stream. Compiled only in CUDA builds (FLASHQLA_WITH_CUDA).
#pragma once

#include <cstddef>

#include "core/problem.h"

namespace flashqla::cuda {

size_t forward_workspace_bytes(const Problem& problem, const flashqla_gdn_fwd_params_t& params);
size_t backward_workspace_bytes(const Problem& problem, const flashqla_gdn_bwd_params_t& params);

// "sm90_fused" or "sm90_simple": the kernel gdn_forward runs for these params.
const char* forward_kernel_name(const Problem& problem, const flashqla_gdn_fwd_params_t& params);

void gdn_forward(const Problem& problem, const flashqla_gdn_fwd_params_t& params);
void gdn_backward(const Problem& problem, const flashqla_gdn_bwd_params_t& params);

}  // namespace flashqla::cuda
