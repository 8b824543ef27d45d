// The GDN forward and backward of one (sequence, value head) computed by
// sequence pieces, in fp64: the exact decomposition the GPU's intra-card sequence
// parallelism uses in the forward (docs/design.md §5.2), its backward and context
// parallelism across devices build on. Each piece's work is independent of the
// others' but for two short serial scans, one a direction:
//
//   forward   S_end(p) = M_p S_start(p) + S_local(p)
//             S_local(p): the piece's end state from a zero start;
//             M_p (K×K):  its end state from the identity with v = 0 (the state
//                         update is affine in the state, linear in v);
//   backward  dS_start(p) = M_pᵀ dS_end(p) + dS_local(p)
//             dS_local(p): the piece's dh0 with dht = 0 (the gradient w.r.t. the
//                          start state is linear in (do, dht) and does not depend
//                          on the start state).
//
// Then every piece reruns from its true start state (forward: o; backward: its
// dq, dk, dv, dg, dβ with dht = its true dS_end). The pieces are the chunked
// algorithm's (chunked_reference.h) on sub-ranges of the sequence; piece
// boundaries need not fall on chunk boundaries.
#pragma once

#include <cstdint>
#include <vector>

#include "cpu/head_problem.h"

namespace flashqla::cpu {

// Token offsets of pieces of at most piece_tokens tokens covering [0, T): at least
// one piece (an empty sequence has one empty piece).
std::vector<int64_t> piece_bounds(int64_t T, int64_t piece_tokens);

// The per-piece quantities of the forward scan: for each piece p, M_p (K×K) and
// S_local(p) (K×V), row-major.
struct PieceTransitions {
  std::vector<std::vector<double>> m, s_local;
};

// M_p and S_local(p) of every piece (independent of one another).
PieceTransitions piece_transitions(const HeadInputs& in, const std::vector<int64_t>& bounds);

// The start state of every piece (K×V each) from h0 (nullptr: zero) by the scan
// S_start(p + 1) = M_p S_start(p) + S_local(p); one more entry at the end: the
// final state.
std::vector<std::vector<double>> piece_start_states(const PieceTransitions& tr, const double* h0, int64_t K,
                                                    int64_t V);

// The forward by pieces of at most piece_tokens tokens (out as chunked_forward).
void piecewise_forward(const HeadInputs& in, const HeadOutputs& out, int64_t piece_tokens);

// The backward by pieces (grads as chunked_backward).
void piecewise_backward(const HeadInputs& in, const HeadGradInputs& gin, const HeadGrads& grads,
                        int64_t piece_tokens);

}  // namespace flashqla::cpu
