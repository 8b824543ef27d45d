// The per-token GDN recurrence in fp64: the oracle every other
// implementation is checked against.
//
//   S  = exp(g_t) S;  v' = beta_t (v_t − Sᵀ k_t);  S = S + k_t v'ᵀ;  o_t = scale Sᵀ q_t
#pragma once

#include "cpu/head_problem.h"

namespace flashqla::cpu {

void recurrent_forward(const HeadInputs& in, const HeadOutputs& out);

// Reverse-mode through the recurrence. States are checkpointed every 64
// tokens and rebuilt segment by segment, so memory stays O((T/64)·K·V).
void recurrent_backward(const HeadInputs& in, const HeadGradInputs& gin, const HeadGrads& grads);

}  // namespace flashqla::cpu
