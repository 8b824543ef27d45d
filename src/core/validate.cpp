#include "core/validate.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/memory_kind.h"
#include "core/sequences.h"
#include "core/state_pool.h"

namespace flashqla {
namespace {

// One tensor argument and how it must look.
struct TensorArg {
  const char* name;
  const flashqla_tensor_t* tensor;
  int rank;  // number of strides read
};

void check_float_tensor(const char* entry, const TensorArg& a, bool elements_exist) {
  const flashqla_tensor_t& x = *a.tensor;
  if (x.data == nullptr && !elements_exist) return;  // an empty tensor: nothing is read or written
  FLASHQLA_REQUIRE(x.data != nullptr, entry, ": ", a.name, ": pointer is NULL (required)");
  if (!is_float_dtype(x.dtype)) {
    fail(FLASHQLA_STATUS_NOT_SUPPORTED,
         str(entry, ": ", a.name, ": unsupported dtype ", dtype_name(x.dtype), " (",
             int(x.dtype), "); expected float32, float16, bfloat16 or float64"));
  }
  FLASHQLA_REQUIRE(x.stride[a.rank - 1] == 1, entry, ": ", a.name, ".stride[", a.rank - 1,
                   "]: the last dimension must be contiguous (stride 1), got ",
                   x.stride[a.rank - 1]);
}

void check_sizes(const flashqla_gdn_fwd_params_t& p, const char* entry) {
  FLASHQLA_REQUIRE(p.B >= 1, entry, ": B: must be >= 1, got ", p.B);
  FLASHQLA_REQUIRE(p.T >= 0, entry, ": T: must be >= 0, got ", p.T);
  FLASHQLA_REQUIRE(p.H >= 1, entry, ": H: must be >= 1, got ", p.H);
  FLASHQLA_REQUIRE(p.HV >= 1, entry, ": HV: must be >= 1, got ", p.HV);
  FLASHQLA_REQUIRE(p.HV % p.H == 0, entry, ": HV: the number of value heads (", p.HV,
                   ") must be a multiple of the number of q/k heads H (", p.H, ")");
  if (p.K < 1 || p.K > FLASHQLA_MAX_HEAD_DIM) {
    fail(p.K < 1 ? FLASHQLA_STATUS_INVALID_ARGUMENT : FLASHQLA_STATUS_NOT_SUPPORTED,
         str(entry, ": K: key head dim must be in 1..", FLASHQLA_MAX_HEAD_DIM, ", got ", p.K));
  }
  if (p.V < 1 || p.V > FLASHQLA_MAX_HEAD_DIM) {
    fail(p.V < 1 ? FLASHQLA_STATUS_INVALID_ARGUMENT : FLASHQLA_STATUS_NOT_SUPPORTED,
         str(entry, ": V: value head dim must be in 1..", FLASHQLA_MAX_HEAD_DIM, ", got ", p.V));
  }
}

void check_enums(const flashqla_gdn_fwd_params_t& p, const char* entry) {
  FLASHQLA_REQUIRE(p.backend == FLASHQLA_BACKEND_AUTO || p.backend == FLASHQLA_BACKEND_CPU ||
                       p.backend == FLASHQLA_BACKEND_CUDA,
                   entry, ": backend: unknown value ", int(p.backend));
  FLASHQLA_REQUIRE(p.beta_activation == FLASHQLA_BETA_IDENTITY ||
                       p.beta_activation == FLASHQLA_BETA_SIGMOID ||
                       p.beta_activation == FLASHQLA_BETA_SIGMOID_X2,
                   entry, ": beta_activation: unknown value ", int(p.beta_activation));
  FLASHQLA_REQUIRE(p.cpu_algorithm == FLASHQLA_CPU_ALGORITHM_CHUNKED ||
                       p.cpu_algorithm == FLASHQLA_CPU_ALGORITHM_RECURRENT,
                   entry, ": cpu_algorithm: unknown value ", int(p.cpu_algorithm));
  FLASHQLA_REQUIRE(p.cpu_num_threads >= 0, entry, ": cpu_num_threads: must be >= 0, got ",
                   p.cpu_num_threads);
  FLASHQLA_REQUIRE(!std::isinf(p.scale), entry, ": scale: must be finite (NaN selects K^-1/2), got ",
                   p.scale);
}

// A 1-d index tensor (cu_seqlens, state_indices): int32 or int64, contiguous.
void check_index_tensor(const flashqla_tensor_t& t, const char* entry, const char* name) {
  if (!is_index_dtype(t.dtype)) {
    fail(FLASHQLA_STATUS_NOT_SUPPORTED, str(entry, ": ", name, ": unsupported dtype ", dtype_name(t.dtype), " (",
                                            int(t.dtype), "); expected int32 or int64"));
  }
  FLASHQLA_REQUIRE(t.stride[0] == 1, entry, ": ", name, ".stride[0]: must be contiguous (stride 1), got ",
                   t.stride[0]);
}

// Resolves the sequence count and checks cu_seqlens' shape and dtype.
void check_sequences(const flashqla_gdn_fwd_params_t& p, const char* entry, Problem& pr) {
  pr.varlen = p.cu_seqlens.data != nullptr;
  if (pr.varlen) {
    FLASHQLA_REQUIRE(p.B == 1, entry, ": B: must be 1 when cu_seqlens is given (sequences are "
                     "packed into one batch row), got B = ", p.B);
    check_index_tensor(p.cu_seqlens, entry, "cu_seqlens");
    FLASHQLA_REQUIRE(p.N >= 1, entry, ": N: must be >= 1 with cu_seqlens (cu_seqlens has N + 1 "
                     "entries), got ", p.N);
    pr.N = p.N;
  } else {
    FLASHQLA_REQUIRE(p.cu_seqlens_host == nullptr, entry,
                     ": cu_seqlens_host: given without cu_seqlens");
    FLASHQLA_REQUIRE(p.N == 0 || p.N == p.B, entry, ": N: without cu_seqlens every batch row is "
                     "one sequence, so N must be 0 or B = ", p.B, ", got ", p.N);
    pr.N = p.B;
  }
}

void check_forward_tensors(const flashqla_gdn_fwd_params_t& p, const char* entry,
                           bool as_backward, Problem& pr) {
  const bool tokens = p.B * p.T > 0;
  const TensorArg inputs[] = {
      {"q", &p.q, 4}, {"k", &p.k, 4}, {"v", &p.v, 4},
      {"g", &p.g, 3}, {"beta", &p.beta, 3},
  };
  for (const TensorArg& a : inputs) check_float_tensor(entry, a, tokens);
  if (!as_backward) check_float_tensor(entry, {"o", &p.o, 4}, tokens);

  pr.has_initial_state = p.initial_state.data != nullptr;
  pr.pooled = p.state_indices.data != nullptr;
  if (pr.pooled) {
    FLASHQLA_REQUIRE(!as_backward, entry, ": state_indices: the state-pool entry is forward only; "
                     "the backward takes one initial state per sequence");
    check_index_tensor(p.state_indices, entry, "state_indices");
    FLASHQLA_REQUIRE(pr.has_initial_state, entry,
                     ": state_indices: given without initial_state, the state pool it indexes");
    FLASHQLA_REQUIRE(p.initial_state_n >= 1, entry, ": initial_state_n: the state pool's slot count "
                     "must be >= 1, got ", p.initial_state_n);
    pr.pool_slots = p.initial_state_n;
  } else {
    FLASHQLA_REQUIRE(p.state_indices_host == nullptr, entry,
                     ": state_indices_host: given without state_indices");
  }
  if (pr.has_initial_state) {
    check_float_tensor(entry, {"initial_state", &p.initial_state, 4}, true);
    FLASHQLA_REQUIRE(pr.pooled || p.initial_state_n == pr.N, entry,
                     ": initial_state: the number of initial states (initial_state_n = ",
                     p.initial_state_n, ") must equal the number of sequences N = ", pr.N,
                     pr.varlen ? " (len(cu_seqlens) - 1)" : " (B)");
  }
  FLASHQLA_REQUIRE(p.checkpoint_chunks >= 0, entry, ": checkpoint_chunks: must be >= 0 (0: no checkpoints), got ",
                   p.checkpoint_chunks);
  if (p.checkpoint_chunks > 0) {
    FLASHQLA_REQUIRE(!as_backward, entry, ": checkpoint_chunks: checkpoints are written by the forward only");
    const int64_t needed = p.B * p.T / (64 * p.checkpoint_chunks);
    check_float_tensor(entry, {"checkpoints", &p.checkpoints, 4}, needed > 0);
    FLASHQLA_REQUIRE(p.checkpoints_n >= needed, entry, ": checkpoints_n: must be at least floor(B T / (64 ",
                     "checkpoint_chunks)) = ", needed, " (every sequence's checkpoints, whatever the lengths), got ",
                     p.checkpoints_n);
    pr.checkpoint_chunks = p.checkpoint_chunks;
  } else {
    FLASHQLA_REQUIRE(p.checkpoints.data == nullptr, entry,
                     ": checkpoints: given without checkpoint_chunks (how many chunks between two)");
  }
  pr.output_final_state = !as_backward && p.output_final_state != 0;
  if (pr.output_final_state) {
    check_float_tensor(entry, {"final_state", &p.final_state, 4}, true);
  }
}

// All pointers the call reads or writes on the backend's side.
std::vector<std::pair<const char*, const void*>> device_side_pointers(
    const flashqla_gdn_fwd_params_t& p, const flashqla_gdn_bwd_params_t* bwd) {
  std::vector<std::pair<const char*, const void*>> ptrs = {
      {"q", p.q.data}, {"k", p.k.data}, {"v", p.v.data}, {"g", p.g.data},
      {"beta", p.beta.data}, {"initial_state", p.initial_state.data},
      {"cu_seqlens", p.cu_seqlens.data}, {"state_indices", p.state_indices.data},
      {"checkpoints", p.checkpoints.data},
      {"workspace", p.workspace}};
  if (bwd) {
    const std::pair<const char*, const void*> more[] = {
        {"d_o", bwd->d_o.data}, {"d_final_state", bwd->d_final_state.data},
        {"dq", bwd->dq.data}, {"dk", bwd->dk.data}, {"dv", bwd->dv.data}, {"dg", bwd->dg.data},
        {"dbeta", bwd->dbeta.data}, {"d_initial_state", bwd->d_initial_state.data}};
    ptrs.insert(ptrs.end(), std::begin(more), std::end(more));
  } else {
    ptrs.push_back({"o", p.o.data});
    if (p.output_final_state) ptrs.push_back({"final_state", p.final_state.data});
  }
  return ptrs;
}

bool compatible(MemoryKind kind, flashqla_backend_t backend) {
  if (kind == MemoryKind::Managed) return true;
  return backend == FLASHQLA_BACKEND_CUDA ? kind == MemoryKind::Device : kind == MemoryKind::Host;
}

void resolve_backend(const flashqla_gdn_fwd_params_t& p, const flashqla_gdn_bwd_params_t* bwd,
                     const char* entry, Problem& pr) {
  // Each pointer's location is queried once (a runtime call per pointer).
  std::vector<std::pair<const char*, MemoryKind>> kinds;
  for (const auto& [name, ptr] : device_side_pointers(p, bwd)) {
    if (ptr != nullptr) kinds.emplace_back(name, pointer_memory_kind(ptr));
  }
  flashqla_backend_t backend = p.backend;
  if (backend == FLASHQLA_BACKEND_AUTO) {
    backend = kinds.empty() || kinds.front().second == MemoryKind::Host ? FLASHQLA_BACKEND_CPU
                                                                          : FLASHQLA_BACKEND_CUDA;
  }
#ifndef FLASHQLA_WITH_CUDA
  if (backend == FLASHQLA_BACKEND_CUDA) {
    fail(FLASHQLA_STATUS_NOT_SUPPORTED,
         str(entry, ": backend: this build of flashqla has no CUDA backend "
                    "(configured with FLASHQLA_ENABLE_CUDA=OFF, or AUTO where no CUDA "
                    "compiler was found)"));
  }
#endif
  for (const auto& [name, kind] : kinds) {
    FLASHQLA_REQUIRE(compatible(kind, backend), entry, ": ", name, ": points to ",
                     memory_kind_name(kind), " but the ",
                     backend == FLASHQLA_BACKEND_CUDA ? "CUDA" : "CPU",
                     " backend was selected; every tensor must live on the same side");
  }
  pr.backend = backend;
  if (backend == FLASHQLA_BACKEND_CUDA) {
    const std::pair<const char*, flashqla_dtype_t> dtypes[] = {
        {"q", p.q.dtype}, {"k", p.k.dtype}, {"v", p.v.dtype}, {"g", p.g.dtype},
        {"beta", p.beta.dtype}, {"initial_state", p.initial_state.dtype},
        {"o", p.o.dtype}, {"final_state", p.final_state.dtype}};
    for (const auto& [name, dtype] : dtypes) {
      if (dtype == FLASHQLA_DTYPE_FLOAT64) {
        fail(FLASHQLA_STATUS_NOT_SUPPORTED,
             str(entry, ": ", name, ": float64 is supported on the CPU backend only"));
      }
    }
  }
}

bool env_flag(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// The slot indices, where the host can read them: checked, and kept for the
// CPU backend.
void check_state_index_contents(const flashqla_gdn_fwd_params_t& p, const char* entry, Problem& pr) {
  if (!pr.pooled) return;
  if (p.state_indices_host != nullptr) {
    pr.state_indices_host = read_state_indices(p.state_indices_host, p.state_indices.dtype, pr.N);
    check_state_indices(pr.state_indices_host, pr.pool_slots, entry, "state_indices_host");
  }
  if (pr.backend == FLASHQLA_BACKEND_CPU) {
    std::vector<int64_t> idx = read_state_indices(p.state_indices.data, p.state_indices.dtype, pr.N);
    check_state_indices(idx, pr.pool_slots, entry, "state_indices");
    for (size_t i = 0; i < pr.state_indices_host.size(); ++i) {
      FLASHQLA_REQUIRE(pr.state_indices_host[i] == idx[i], entry, ": state_indices_host: differs from "
                       "state_indices at index ", i, " (", pr.state_indices_host[i], " vs ", idx[i], ")");
    }
    pr.state_indices_host = std::move(idx);
  }
}

void check_sequence_contents(const flashqla_gdn_fwd_params_t& p, const char* entry,
                             Problem& pr) {
  if (!pr.varlen) return;
  if (p.cu_seqlens_host != nullptr) {
    pr.cu_seqlens_host = read_cu_seqlens(p.cu_seqlens_host, p.cu_seqlens.dtype, pr.N + 1);
    check_cu_seqlens(pr.cu_seqlens_host, p.T, entry, "cu_seqlens_host");
  }
  if (pr.backend == FLASHQLA_BACKEND_CPU) {
    // The CPU computes with cu_seqlens itself; a host copy, if any, must agree.
    std::vector<int64_t> cu = read_cu_seqlens(p.cu_seqlens.data, p.cu_seqlens.dtype, pr.N + 1);
    check_cu_seqlens(cu, p.T, entry, "cu_seqlens");
    for (size_t i = 0; i < pr.cu_seqlens_host.size(); ++i) {
      FLASHQLA_REQUIRE(pr.cu_seqlens_host[i] == cu[i], entry, ": cu_seqlens_host: differs from "
                       "cu_seqlens at index ", i, " (", pr.cu_seqlens_host[i], " vs ", cu[i], ")");
    }
    pr.cu_seqlens_host = std::move(cu);
  }
  pr.debug_check_cu_seqlens =
      pr.backend == FLASHQLA_BACKEND_CUDA && pr.cu_seqlens_host.empty() &&
      (p.debug_check_cu_seqlens != 0 || env_flag("FLASHQLA_DEBUG_CHECK_CU_SEQLENS"));
}

Problem validate_common(const flashqla_gdn_fwd_params_t* params, const flashqla_gdn_bwd_params_t* bwd,
                        const char* entry) {
  FLASHQLA_REQUIRE(params != nullptr, entry, ": params: pointer is NULL");
  const flashqla_gdn_fwd_params_t& p = *params;
  Problem pr;
  check_sizes(p, entry);
  check_enums(p, entry);
  check_sequences(p, entry, pr);
  check_forward_tensors(p, entry, bwd != nullptr, pr);
  if (bwd) {
    const bool tokens = p.B * p.T > 0;
    const TensorArg grads[] = {
        {"d_o", &bwd->d_o, 4}, {"dq", &bwd->dq, 4}, {"dk", &bwd->dk, 4},
        {"dv", &bwd->dv, 4},   {"dg", &bwd->dg, 3},  {"dbeta", &bwd->dbeta, 3},
    };
    for (const TensorArg& a : grads) check_float_tensor(entry, a, tokens);
    if (bwd->d_final_state.data != nullptr) {
      check_float_tensor(entry, {"d_final_state", &bwd->d_final_state, 4}, true);
    }
    if (pr.has_initial_state) {
      check_float_tensor(entry, {"d_initial_state", &bwd->d_initial_state, 4}, true);
    }
  }
  pr.B = p.B;
  pr.T = p.T;
  pr.H = p.H;
  pr.HV = p.HV;
  pr.K = p.K;
  pr.V = p.V;
  pr.group = p.HV / p.H;
  pr.scale = std::isnan(p.scale) ? 1.0 / std::sqrt(double(p.K)) : p.scale;
  resolve_backend(p, bwd, entry, pr);
  check_sequence_contents(p, entry, pr);
  check_state_index_contents(p, entry, pr);
  return pr;
}

}  // namespace

Problem validate_forward(const flashqla_gdn_fwd_params_t* params, const char* entry) {
  return validate_common(params, nullptr, entry);
}

Problem validate_backward(const flashqla_gdn_bwd_params_t* params, const char* entry) {
  FLASHQLA_REQUIRE(params != nullptr, entry, ": params: pointer is NULL");
  return validate_common(&params->fwd, params, entry);
}

}  // namespace flashqla
