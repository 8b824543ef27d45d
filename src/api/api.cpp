// The extern "C" entry points: validate and plan each call once (dispatch.h),
// run it on its backend, and turn any error into a status plus a thread-local
// message.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <string>

#include "api/dispatch.h"
#include "core/error.h"
#include "core/trace.h"
#include "core/validate.h"
#include "flashqla/flashqla.h"

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

// reason, truncated to fit a choice's buffer, NUL-terminated.
void copy_reason(const std::string& reason, char (&out)[FLASHQLA_REASON_CAPACITY]) {
  const size_t n = std::min(reason.size(), sizeof(out) - 1);
  std::memcpy(out, reason.data(), n);
  out[n] = '\0';
}

void fill_choice(const api::ForwardCall& call, flashqla_gdn_fwd_kernel_choice_t& choice) {
  choice = flashqla_gdn_fwd_kernel_choice_t{};
  choice.backend = call.problem.backend;
  choice.kernel = call.kernel;
  choice.kernel_name = api::kernel_name(call.kernel);
  choice.pieces = call.pieces;
  choice.piece_chunks = call.piece_chunks;
  choice.lengths_guessed = call.lengths_guessed ? 1 : 0;
  choice.workspace_bytes = call.workspace_bytes;
  copy_reason(call.reason, choice.reason);
}

void fill_choice(const api::BackwardCall& call, flashqla_gdn_bwd_kernel_choice_t& choice) {
  choice = flashqla_gdn_bwd_kernel_choice_t{};
  choice.backend = call.problem.backend;
  choice.kernel = call.kernel;
  choice.kernel_name = api::kernel_name(call.kernel);
  choice.piece_chunks = call.piece_chunks;
  choice.workspace_bytes = call.workspace_bytes;
  copy_reason(call.reason, choice.reason);
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
    *bytes = flashqla::api::plan_forward(params, entry).workspace_bytes;
  });
}

flashqla_status_t flashqla_gdn_bwd_workspace_size(const flashqla_gdn_bwd_params_t* params,
                                                  size_t* bytes) {
  flashqla::TraceRange trace("flashqla_gdn_bwd_workspace_size");
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_bwd_workspace_size";
    FLASHQLA_REQUIRE(bytes != nullptr, entry, ": bytes: pointer is NULL");
    *bytes = flashqla::api::plan_backward(params, entry).workspace_bytes;
  });
}

flashqla_status_t flashqla_gdn_fwd(const flashqla_gdn_fwd_params_t* params) {
  flashqla::TraceRange trace("flashqla_gdn_fwd");
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_fwd";
    const flashqla::api::ForwardCall call = flashqla::api::plan_forward(params, entry);
    flashqla::check_workspace(entry, call.workspace_bytes, params->workspace, params->workspace_bytes);
    const flashqla::Problem& pr = call.problem;
    FLASHQLA_PLAN("%s: backend=%s B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld N=%lld varlen=%d h0=%d ht=%d "
                  "kernel=%s pieces=%s piece_chunks=%lld lengths_guessed=%d workspace=%zu", entry,
                  pr.backend == FLASHQLA_BACKEND_CUDA ? "cuda" : "cpu", (long long)pr.B, (long long)pr.T,
                  (long long)pr.H, (long long)pr.HV, (long long)pr.K, (long long)pr.V, (long long)pr.N,
                  int(pr.varlen), int(pr.has_initial_state), int(pr.output_final_state),
                  flashqla::api::kernel_name(call.kernel), flashqla::api::pieces_name(call.pieces),
                  (long long)call.piece_chunks, int(call.lengths_guessed), call.workspace_bytes);
    if (!call.reason.empty()) FLASHQLA_PLAN("%s: not the fused kernel: %s", entry, call.reason.c_str());
    flashqla::api::run_forward(call, *params);
  });
}

flashqla_status_t flashqla_gdn_bwd(const flashqla_gdn_bwd_params_t* params) {
  flashqla::TraceRange trace("flashqla_gdn_bwd");
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_bwd";
    const flashqla::api::BackwardCall call = flashqla::api::plan_backward(params, entry);
    flashqla::check_workspace(entry, call.workspace_bytes, params->fwd.workspace, params->fwd.workspace_bytes);
    const flashqla::Problem& pr = call.problem;
    FLASHQLA_PLAN("%s: backend=%s B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld N=%lld varlen=%d h0=%d kernel=%s "
                  "workspace=%zu", entry, pr.backend == FLASHQLA_BACKEND_CUDA ? "cuda" : "cpu", (long long)pr.B,
                  (long long)pr.T, (long long)pr.H, (long long)pr.HV, (long long)pr.K, (long long)pr.V,
                  (long long)pr.N, int(pr.varlen), int(pr.has_initial_state), flashqla::api::kernel_name(call.kernel),
                  call.workspace_bytes);
    if (!call.reason.empty()) FLASHQLA_PLAN("%s: not the tensor-core backward: %s", entry, call.reason.c_str());
    flashqla::api::run_backward(call, *params);
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

flashqla_status_t flashqla_gdn_fwd_kernel_choice(const flashqla_gdn_fwd_params_t* params,
                                                 flashqla_gdn_fwd_kernel_choice_t* choice) {
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_fwd_kernel_choice";
    FLASHQLA_REQUIRE(choice != nullptr, entry, ": choice: pointer is NULL");
    flashqla::fill_choice(flashqla::api::plan_forward(params, entry), *choice);
  });
}

flashqla_status_t flashqla_gdn_bwd_kernel_choice(const flashqla_gdn_bwd_params_t* params,
                                                 flashqla_gdn_bwd_kernel_choice_t* choice) {
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_bwd_kernel_choice";
    FLASHQLA_REQUIRE(choice != nullptr, entry, ": choice: pointer is NULL");
    flashqla::fill_choice(flashqla::api::plan_backward(params, entry), *choice);
  });
}

flashqla_status_t flashqla_gdn_fwd_kernel_name(const flashqla_gdn_fwd_params_t* params, const char** name) {
  return guarded([&] {
    constexpr const char* entry = "flashqla_gdn_fwd_kernel_name";
    FLASHQLA_REQUIRE(name != nullptr, entry, ": name: pointer is NULL");
    *name = flashqla::api::kernel_name(flashqla::api::plan_forward(params, entry).kernel);
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
