// The extern "C" entry points: validate, pick the backend, run, and turn any
// error into a status plus a thread-local message.
#include <cmath>
#include <new>

#include "core/error.h"
#include "core/trace.h"
#include "core/validate.h"
#include "cpu/cpu_backend.h"
#include "flashqla/flashqla.h"

#ifdef FLASHQLA_WITH_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace flashqla {
namespace {

template <typename Body>
flashqla_status_t guarded(Body&& body) {
  clear_last_error();
  try {
    body();
    return FLASHQLA_STATUS_SUCCESS;
  } catch (const Error& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error("flashqla: out of host memory");
    return FLASHQLA_STATUS_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(str("flashqla: internal error: ", e.what()));
    return FLASHQLA_STATUS_INTERNAL_ERROR;
  } catch (...) {
    set_last_error("flashqla: internal error: unknown exception");
    return FLASHQLA_STATUS_INTERNAL_ERROR;
  }
}

size_t forward_workspace(const Problem& pr, const flashqla_gdn_fwd_params_t& p) {
#ifdef FLASHQLA_WITH_CUDA
  if (pr.backend == FLASHQLA_BACKEND_CUDA) return cuda::forward_workspace_bytes(pr, p);
#endif
  return 0;  // the CPU backend keeps its fp64 scratch on the host heap
}

size_t backward_workspace(const Problem& pr, const flashqla_gdn_bwd_params_t& p) {
#ifdef FLASHQLA_WITH_CUDA
  if (pr.backend == FLASHQLA_BACKEND_CUDA) return cuda::backward_workspace_bytes(pr, p);
#endif
  return 0;
}

void check_workspace(const char* entry, size_t needed, const void* workspace, size_t given) {
  if (given < needed || (needed > 0 && workspace == nullptr)) {
    fail(FLASHQLA_STATUS_WORKSPACE_TOO_SMALL,
         str(entry, ": workspace: needs ", needed, " bytes (see flashqla_gdn_*_workspace_size), got ",
             workspace == nullptr ? size_t(0) : given, workspace == nullptr ? " (NULL)" : ""));
  }
}

}  // namespace
}  // namespace flashqla

using flashqla::guarded;

extern "C" {

void flashqla_gdn_fwd_params_init(flashqla_gdn_fwd_params_t* params) {
  if (params == nullptr) return;
  *params = flashqla_gdn_fwd_params_t{};
  params->scale = NAN;
  params->backend = FLASHQLA_BACKEND_AUTO;
  params->beta_activation = FLASHQLA_BETA_IDENTITY;
  params->cpu_algorithm = FLASHQLA_CPU_ALGORITHM_CHUNKED;
}

void flashqla_gdn_bwd_params_init(flashqla_gdn_bwd_params_t* params) {
  if (params == nullptr) return;
  *params = flashqla_gdn_bwd_params_t{};
  flashqla_gdn_fwd_params_init(&params->fwd);
}

flashqla_status_t flashqla_gdn_fwd_workspace_size(const flashqla_gdn_fwd_params_t* params,
                                                  size_t* bytes) {
  flashqla::TraceRange trace("flashqla_gdn_fwd_workspace_size");
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_fwd_workspace_size";
    FLASHQLA_REQUIRE(bytes != nullptr, entry, ": bytes: pointer is NULL");
    const flashqla::Problem pr = flashqla::validate_forward(params, entry);
    *bytes = flashqla::forward_workspace(pr, *params);
  });
}

flashqla_status_t flashqla_gdn_bwd_workspace_size(const flashqla_gdn_bwd_params_t* params,
                                                  size_t* bytes) {
  flashqla::TraceRange trace("flashqla_gdn_bwd_workspace_size");
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_bwd_workspace_size";
    FLASHQLA_REQUIRE(bytes != nullptr, entry, ": bytes: pointer is NULL");
    const flashqla::Problem pr = flashqla::validate_backward(params, entry);
    *bytes = flashqla::backward_workspace(pr, *params);
  });
}

flashqla_status_t flashqla_gdn_fwd(const flashqla_gdn_fwd_params_t* params) {
  flashqla::TraceRange trace("flashqla_gdn_fwd");
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_fwd";
    const flashqla::Problem pr = flashqla::validate_forward(params, entry);
    flashqla::check_workspace(entry, flashqla::forward_workspace(pr, *params), params->workspace,
                              params->workspace_bytes);
    FLASHQLA_PLAN("%s: backend=%s B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld N=%lld varlen=%d h0=%d ht=%d", entry,
                  pr.backend == FLASHQLA_BACKEND_CUDA ? "cuda" : "cpu", (long long)pr.B, (long long)pr.T,
                  (long long)pr.H, (long long)pr.HV, (long long)pr.K, (long long)pr.V, (long long)pr.N,
                  int(pr.varlen), int(pr.has_initial_state), int(pr.output_final_state));
#ifdef FLASHQLA_WITH_CUDA
    if (pr.backend == FLASHQLA_BACKEND_CUDA) return flashqla::cuda::gdn_forward(pr, *params);
#endif
    flashqla::cpu::gdn_forward(pr, *params);
  });
}

flashqla_status_t flashqla_gdn_bwd(const flashqla_gdn_bwd_params_t* params) {
  flashqla::TraceRange trace("flashqla_gdn_bwd");
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_bwd";
    const flashqla::Problem pr = flashqla::validate_backward(params, entry);
    flashqla::check_workspace(entry, flashqla::backward_workspace(pr, *params),
                              params->fwd.workspace, params->fwd.workspace_bytes);
    FLASHQLA_PLAN("%s: backend=%s B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld N=%lld varlen=%d h0=%d", entry,
                  pr.backend == FLASHQLA_BACKEND_CUDA ? "cuda" : "cpu", (long long)pr.B, (long long)pr.T,
                  (long long)pr.H, (long long)pr.HV, (long long)pr.K, (long long)pr.V, (long long)pr.N,
                  int(pr.varlen), int(pr.has_initial_state));
#ifdef FLASHQLA_WITH_CUDA
    if (pr.backend == FLASHQLA_BACKEND_CUDA) return flashqla::cuda::gdn_backward(pr, *params);
#endif
    flashqla::cpu::gdn_backward(pr, *params);
  });
}

flashqla_status_t flashqla_gdn_resolve_backend(const flashqla_gdn_fwd_params_t* params,
                                               flashqla_backend_t* backend) {
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_resolve_backend";
    FLASHQLA_REQUIRE(backend != nullptr, entry, ": backend: pointer is NULL");
    *backend = flashqla::validate_forward(params, entry).backend;
  });
}

flashqla_status_t flashqla_gdn_fwd_kernel_name(const flashqla_gdn_fwd_params_t* params, const char** name) {
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_fwd_kernel_name";
    FLASHQLA_REQUIRE(name != nullptr, entry, ": name: pointer is NULL");
    const flashqla::Problem pr = flashqla::validate_forward(params, entry);
#ifdef FLASHQLA_WITH_CUDA
    if (pr.backend == FLASHQLA_BACKEND_CUDA) {
      *name = flashqla::cuda::forward_kernel_name(pr, *params);
      return;
    }
#endif
    *name = params->cpu_algorithm == FLASHQLA_CPU_ALGORITHM_RECURRENT ? "cpu_recurrent" : "cpu_chunked";
  });
}

const char* flashqla_status_string(flashqla_status_t status) {
  switch (status) {
    case FLASHQLA_STATUS_SUCCESS: return "FLASHQLA_STATUS_SUCCESS";
    case FLASHQLA_STATUS_INVALID_ARGUMENT: return "FLASHQLA_STATUS_INVALID_ARGUMENT";
    case FLASHQLA_STATUS_NOT_SUPPORTED: return "FLASHQLA_STATUS_NOT_SUPPORTED";
    case FLASHQLA_STATUS_WORKSPACE_TOO_SMALL: return "FLASHQLA_STATUS_WORKSPACE_TOO_SMALL";
    case FLASHQLA_STATUS_CUDA_ERROR: return "FLASHQLA_STATUS_CUDA_ERROR";
    case FLASHQLA_STATUS_OUT_OF_MEMORY: return "FLASHQLA_STATUS_OUT_OF_MEMORY";
    case FLASHQLA_STATUS_INVALID_CU_SEQLENS: return "FLASHQLA_STATUS_INVALID_CU_SEQLENS";
    case FLASHQLA_STATUS_INTERNAL_ERROR: return "FLASHQLA_STATUS_INTERNAL_ERROR";
  }
  return "unknown flashqla status";
}

int flashqla_version(void) { return FLASHQLA_VERSION; }

const char* flashqla_version_string(void) {
#define FLASHQLA_STR2(x) #x
#define FLASHQLA_STR(x) FLASHQLA_STR2(x)
  return FLASHQLA_STR(FLASHQLA_VERSION_MAJOR) "." FLASHQLA_STR(FLASHQLA_VERSION_MINOR) "." FLASHQLA_STR(
      FLASHQLA_VERSION_PATCH);
#undef FLASHQLA_STR
#undef FLASHQLA_STR2
}

int flashqla_has_cuda_backend(void) {
#ifdef FLASHQLA_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

}  // extern "C"
