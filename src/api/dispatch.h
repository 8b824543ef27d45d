// The layer above the core and both backends: validates a call (core), resolves
// its backend and asks that backend for its plan, once per call. The entry
// points (api.cpp) read the plan for the workspace size, the kernel choice and
// the launch, so no call plans twice. Includes point down only: api/ includes
// core/, cpu/ and cuda/; cpu/ and cuda/ include core/; core/ includes neither.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/problem.h"
#include "flashqla/flashqla.h"

#ifdef FLASHQLA_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace flashqla::api {

// One validated forward call and its plan, whichever backend runs it.
struct ForwardCall {
  Problem problem;
  flashqla_fwd_kernel_t kernel = FLASHQLA_FWD_KERNEL_CPU_CHUNKED;
  std::string reason;  // why not the fused kernel ("" when it runs)
  flashqla_fwd_pieces_t pieces = FLASHQLA_FWD_PIECES_NONE;
  int64_t piece_chunks = 0;
  bool lengths_guessed = false;
  size_t workspace_bytes = 0;
#ifdef FLASHQLA_WITH_CUDA
  cuda::ForwardPlan cuda;  // the CUDA backend's plan (CUDA calls only)
#endif
};

// Validates `params` (messages prefixed by `entry`) and plans the call.
ForwardCall plan_forward(const flashqla_gdn_fwd_params_t* params, const char* entry);

// Runs a planned call (plan_forward of the same params).
void run_forward(const ForwardCall& call, const flashqla_gdn_fwd_params_t& params);

// One validated backward call and its plan, whichever backend runs it.
struct BackwardCall {
  Problem problem;
  flashqla_bwd_kernel_t kernel = FLASHQLA_BWD_KERNEL_CPU_CHUNKED;
  std::string reason;  // why not the tensor-core backward ("" when it runs)
  int64_t piece_chunks = 0;  // the tensor-core chains' sequence pieces (0: whole sequences)
  size_t workspace_bytes = 0;
#ifdef FLASHQLA_WITH_CUDA
  cuda::BackwardPlan cuda;  // the CUDA backend's plan (CUDA calls only)
#endif
};

// Validates `params` (messages prefixed by `entry`) and plans the call.
BackwardCall plan_backward(const flashqla_gdn_bwd_params_t* params, const char* entry);

// Runs a planned call (plan_backward of the same params).
void run_backward(const BackwardCall& call, const flashqla_gdn_bwd_params_t& params);

// "cpu_chunked", "cpu_recurrent", "sm90_fused", "sm90_simple".
const char* kernel_name(flashqla_fwd_kernel_t kernel);
// "cpu_chunked", "cpu_recurrent", "sm90_tensor_core", "sm90_simple".
const char* kernel_name(flashqla_bwd_kernel_t kernel);
// "none", "passes", "chained".
const char* pieces_name(flashqla_fwd_pieces_t pieces);

}  // namespace flashqla::api
