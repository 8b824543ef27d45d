#include "api/dispatch.h"

#include "core/validate.h"
#include "cpu/cpu_backend.h"

namespace flashqla::api {
namespace {

// The CPU backend runs every call whose tensors are in host memory (or that
// asks for it); its algorithm is the caller's choice.
void plan_cpu_forward(const flashqla_gdn_fwd_params_t& p, ForwardCall& call) {
  call.kernel = p.cpu_algorithm == FLASHQLA_CPU_ALGORITHM_RECURRENT ? FLASHQLA_FWD_KERNEL_CPU_RECURRENT
                                                                   : FLASHQLA_FWD_KERNEL_CPU_CHUNKED;
  call.reason = "the CPU backend computes the call (the fused kernel runs CUDA calls only)";
  call.workspace_bytes = 0;  // the CPU backend keeps its fp64 scratch on the host heap
}

#ifdef FLASHQLA_WITH_CUDA
void plan_cuda_forward(const flashqla_gdn_fwd_params_t& p, const char* entry, ForwardCall& call) {
  call.cuda = cuda::plan_forward(call.problem, p, entry);
  const cuda::ForwardPlan& plan = call.cuda;
  call.kernel = plan.fused ? FLASHQLA_FWD_KERNEL_SM90_FUSED : FLASHQLA_FWD_KERNEL_SM90_SIMPLE;
  call.reason = plan.reason;
  call.pieces = plan.pieces.chunks <= 0 ? FLASHQLA_FWD_PIECES_NONE
                : plan.pieces.chained   ? FLASHQLA_FWD_PIECES_CHAINED
                                        : FLASHQLA_FWD_PIECES_PASSES;
  call.piece_chunks = plan.pieces.chunks > 0 ? plan.pieces.chunks : 0;
  call.lengths_guessed = plan.lengths_guessed;
  call.workspace_bytes = plan.workspace_bytes;
}
#endif

}  // namespace

ForwardCall plan_forward(const flashqla_gdn_fwd_params_t* params, const char* entry) {
  ForwardCall call;
  call.problem = validate_forward(params, entry);
#ifdef FLASHQLA_WITH_CUDA
  if (call.problem.backend == FLASHQLA_BACKEND_CUDA) {
    plan_cuda_forward(*params, entry, call);
    return call;
  }
#endif
  plan_cpu_forward(*params, call);
  return call;
}

void run_forward(const ForwardCall& call, const flashqla_gdn_fwd_params_t& params) {
#ifdef FLASHQLA_WITH_CUDA
  if (call.problem.backend == FLASHQLA_BACKEND_CUDA) return cuda::gdn_forward(call.problem, params, call.cuda);
#endif
  cpu::gdn_forward(call.problem, params);
}

BackwardCall plan_backward(const flashqla_gdn_bwd_params_t* params, const char* entry) {
  BackwardCall call;
  call.problem = validate_backward(params, entry);
#ifdef FLASHQLA_WITH_CUDA
  if (call.problem.backend == FLASHQLA_BACKEND_CUDA) {
    call.cuda = cuda::plan_backward(call.problem, *params, entry);
    call.kernel = call.cuda.tensor_core ? FLASHQLA_BWD_KERNEL_SM90_TENSOR_CORE : FLASHQLA_BWD_KERNEL_SM90_SIMPLE;
    call.reason = call.cuda.reason;
    call.piece_chunks = call.cuda.piece_chunks;
    call.workspace_bytes = call.cuda.bytes;
    return call;
  }
#endif
  // The CPU backend keeps its fp64 scratch on the host heap: no workspace.
  call.kernel = params->fwd.cpu_algorithm == FLASHQLA_CPU_ALGORITHM_RECURRENT ? FLASHQLA_BWD_KERNEL_CPU_RECURRENT
                                                                              : FLASHQLA_BWD_KERNEL_CPU_CHUNKED;
  call.reason = "the CPU backend computes the call (the tensor-core backward runs CUDA calls only)";
  return call;
}

void run_backward(const BackwardCall& call, const flashqla_gdn_bwd_params_t& params) {
#ifdef FLASHQLA_WITH_CUDA
  if (call.problem.backend == FLASHQLA_BACKEND_CUDA) return cuda::gdn_backward(call.problem, params, call.cuda);
#endif
  cpu::gdn_backward(call.problem, params);
}

const char* kernel_name(flashqla_fwd_kernel_t kernel) {
  switch (kernel) {
    case FLASHQLA_FWD_KERNEL_CPU_CHUNKED: return "cpu_chunked";
    case FLASHQLA_FWD_KERNEL_CPU_RECURRENT: return "cpu_recurrent";
    case FLASHQLA_FWD_KERNEL_SM90_FUSED: return "sm90_fused";
    case FLASHQLA_FWD_KERNEL_SM90_SIMPLE: return "sm90_simple";
  }
  return "unknown";
}

const char* kernel_name(flashqla_bwd_kernel_t kernel) {
  switch (kernel) {
    case FLASHQLA_BWD_KERNEL_CPU_CHUNKED: return "cpu_chunked";
    case FLASHQLA_BWD_KERNEL_CPU_RECURRENT: return "cpu_recurrent";
    case FLASHQLA_BWD_KERNEL_SM90_TENSOR_CORE: return "sm90_tensor_core";
    case FLASHQLA_BWD_KERNEL_SM90_SIMPLE: return "sm90_simple";
  }
  return "unknown";
}

const char* pieces_name(flashqla_fwd_pieces_t pieces) {
  switch (pieces) {
    case FLASHQLA_FWD_PIECES_NONE: return "none";
    case FLASHQLA_FWD_PIECES_PASSES: return "passes";
    case FLASHQLA_FWD_PIECES_CHAINED: return "chained";
  }
  return "unknown";
}

}  // namespace flashqla::api
