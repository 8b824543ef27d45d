// The CUDA backend's host side: device checks, the forward's plan, workspace
// layout and kernel launches on the caller's stream. Compiled only in CUDA
// builds (FLASHQLA_WITH_CUDA).
#pragma once

#include <cstddef>

#include "core/problem.h"
#include "cuda/forward_plan.h"

namespace flashqla::cuda {

// Checks what the forward needs beyond validation (an sm_90 device; q, k and v
// in one dtype) and plans the call (forward_plan.h): the kernel, why not the
// fused one, the sequence pieces and the workspace. No device sync, no launch.
ForwardPlan plan_forward(const Problem& problem, const flashqla_gdn_fwd_params_t& params, const char* entry);

size_t backward_workspace_bytes(const Problem& problem, const flashqla_gdn_bwd_params_t& params);

// Runs a planned forward (plan_forward of the same problem and params).
void gdn_forward(const Problem& problem, const flashqla_gdn_fwd_params_t& params, const ForwardPlan& plan);
void gdn_backward(const Problem& problem, const flashqla_gdn_bwd_params_t& params);

}  // namespace flashqla::cuda
