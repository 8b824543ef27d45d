// The chunked GDN algorithm (64-token chunks) in fp64, forward and backward,
// stage by stage as the GPU kernels compute it (docs/design.md, "Chunked
// algorithm"). Per chunk of L ≤ 64 tokens starting from state S (K×V):
//
//   γ  = inclusive cumsum of g within the chunk,  Γ_ij = e^{γ_i − γ_j} (i ≥ j)
//   Ar = (I + StrictLower(diag(β) K Kᵀ))⁻¹              ungated: no state, no gate
//   Vd = (Γ ⊙ Ar) diag(β) (V − diag(e^γ) K S)
//   O  = scale (diag(e^γ) Q S + (Γ ⊙ Q Kᵀ) Vd)
//   S' = e^{γ_L} S + Kᵀ diag(e^{γ_L − γ}) Vd
//
// The stage functions are exposed so device kernels can be checked stage by
// stage against them.
#pragma once

#include <cstdint>

#include "cpu/head_problem.h"

namespace flashqla::cpu {

constexpr int64_t kChunkSize = 64;

// gamma[i] = g[0] + … + g[i], i < L.
void chunk_local_cumsum(const double* g, int64_t L, double* gamma);

// Ar (L×L row-major, unit lower triangular) = (I + StrictLower(diag(β) K Kᵀ))⁻¹
// for the chunk's keys k (L×K) and betas.
void ungated_inverse(const double* k, const double* beta, int64_t L, int64_t K, double* Ar);

// One chunk forward. S (K×V) is read as the chunk's initial state and
// overwritten with its final state; o (L×V) receives the outputs; vd (L×V),
// when not null, receives Vd.
void chunk_forward(const double* q, const double* k, const double* v, const double* gamma,
                   const double* beta, const double* Ar, int64_t L, int64_t K, int64_t V,
                   double scale, double* S, double* o, double* vd);

void chunked_forward(const HeadInputs& in, const HeadOutputs& out);

// Recomputes the chunk-start states, then runs the chunks in reverse.
void chunked_backward(const HeadInputs& in, const HeadGradInputs& gin, const HeadGrads& grads);

}  // namespace flashqla::cpu
