// The CUDA backend's host side: device checks, the forward's plan, workspace
// layout and kernel launches on the caller's stream. Compiled only in CUDA
// builds (FLASHQLA_WITH_CUDA).
#pragma once

#include <cstddef>

#include "core/problem.h"
#include "cuda/backward_plan.h"
#include "cuda/forward_plan.h"

namespace flashqla::cuda {

// Checks what the forward needs beyond validation (an sm_90 device; q, k and v
// in one dtype) and plans the call (forward_plan.h): the kernel, why not the
// fused one, the sequence pieces and the workspace. No device sync, no launch.
ForwardPlan plan_forward(const Problem& problem, const flashqla_gdn_fwd_params_t& params, const char* entry);

// Checks what the backward needs beyond validation (an sm_90 device; q, k and v
// in one dtype) and plans the call (backward_plan.h). No device sync, no launch.
BackwardPlan plan_backward(const Problem& problem, const flashqla_gdn_bwd_params_t& params, const char* entry);

// Runs a planned forward (plan_forward of the same problem and params).
void gdn_forward(const Problem& problem, const flashqla_gdn_fwd_params_t& params, const ForwardPlan& plan);
// Runs a planned backward (plan_backward of the same problem and params).
void gdn_backward(const Problem& problem, const flashqla_gdn_bwd_params_t& params, const BackwardPlan& plan);

}  // namespace flashqla::cuda
