// The validated, resolved form of a call: sizes, sequence boundaries and the
// backend, derived once from the public params by validate.cpp and read by
// every backend.
#pragma once

#include <cstdint>
#include <vector>

#include "flashqla/flashqla.h"

namespace flashqla {

struct Problem {
  int64_t B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0;
  int64_t N = 0;       // number of sequences
  int64_t group = 1;   // HV / H: value heads per q/k head
  double scale = 0.0;  // resolved (NaN in params -> K^-1/2)
  bool varlen = false;
  bool has_initial_state = false;
  bool output_final_state = false;
  // Serving: initial_state / final_state are pools of pool_slots rows, read
  // and written at state_indices[n] (negative: zero start, no write).
  bool pooled = false;
  int64_t pool_slots = 0;
  // The slot indices when readable on the host (CPU backend, or a host copy
  // was given); empty otherwise.
  std::vector<int64_t> state_indices_host;
  // Checkpoints: every checkpoint_chunks chunks (0: none).
  int64_t checkpoint_chunks = 0;
  flashqla_backend_t backend = FLASHQLA_BACKEND_CPU;
  // Sequence boundaries when they are readable on the host (CPU backend, or a
  // host copy of cu_seqlens was given): token offsets of the N + 1 boundaries
  // within the single batch row. Empty otherwise (GPU path plans on device).
  std::vector<int64_t> cu_seqlens_host;
  bool debug_check_cu_seqlens = false;
};

// Element offset of [b, t, h, i] for a 4-d token tensor ([B,T,H,K] / [B,T,HV,V]).
inline int64_t offset4(const flashqla_tensor_t& x, int64_t b, int64_t t, int64_t h, int64_t i) {
  return b * x.stride[0] + t * x.stride[1] + h * x.stride[2] + i * x.stride[3];
}

// Element offset of [b, t, h] for a 3-d per-token tensor (g, beta).
inline int64_t offset3(const flashqla_tensor_t& x, int64_t b, int64_t t, int64_t h) {
  return b * x.stride[0] + t * x.stride[1] + h * x.stride[2];
}

}  // namespace flashqla
