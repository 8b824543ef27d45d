// What every forward kernel receives: sizes, element pointers and strides
// (in elements, last dimension contiguous) of one resolved forward call.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "flashqla/flashqla.h"

namespace flashqla::cuda {

// Which part of a forward a fused-kernel launch computes. Whole sequences is the
// plain forward; the two piece passes plus the piece scan between them are the
// exact intra-card sequence parallelism (docs/design.md): sequences are cut into
// pieces of piece_chunks chunks, every piece but the last gets its end state from
// a zero start (piece 0: from the true initial state) and its transition matrix
// (the same recurrence from the identity with v = 0), the scan chains them into
// each piece's true start state, and the output pass reruns every piece from it.
// Chained pieces (many chains) are one launch: a CTA a piece, each starting from
// the end state its predecessor left in the workspace (work_scheduler.cuh).
enum ForwardPass : int { kWholeSequences = 0, kPiecePartials = 1, kPieceOutputs = 2, kChainedPieces = 3 };
// The per-piece states in ForwardArgs::piece_states: [slot][HV][kind][K][V] fp32.
enum PieceState : int { kPieceLocal = 0, kPieceTransition = 1, kPieceStart = 2, kPieceStateKinds = 3 };

struct ForwardArgs {
  // Sizes.
  int64_t T, H, HV, K, V, N, group;
  float scale;
  // Inputs (element pointers + strides in elements, last dim contiguous).
  const void* q; int64_t q_sb, q_st, q_sh;
  const void* k; int64_t k_sb, k_st, k_sh;
  const void* v; int64_t v_sb, v_st, v_sh;
  const void* g; int64_t g_sb, g_st; flashqla_dtype_t g_dtype;
  const void* beta; int64_t beta_sb, beta_st; flashqla_dtype_t beta_dtype;
  flashqla_dtype_t token_dtype;  // q, k, v
  // Optional initial state [N, HV, K, V] or [N, HV, V, K].
  const void* h0; int64_t h0_sn, h0_sh, h0_s2, h0_s3; flashqla_dtype_t h0_dtype;
  // Optional cu_seqlens [N + 1] (nullptr: sequence n is batch row n).
  const void* cu_seqlens; bool cu_seqlens_int64;
  // Optional state pool slots [N] (the serving entry): h0 and ht are pools of
  // pool_slots rows, sequence n's row is state_indices[n] (state_row()).
  const void* state_indices; bool state_indices_int64; int64_t pool_slots;
  // Optional state checkpoints every ckpt_chunks chunks ([rows, HV, K, V] or
  // V-first): sequence n's j-th at row checkpoint_row0(n) + j − 1.
  void* ckpt; int64_t ckpt_sn, ckpt_sh, ckpt_s2, ckpt_s3; flashqla_dtype_t ckpt_dtype; int64_t ckpt_chunks;
  // Outputs.
  void* o; int64_t o_sb, o_st, o_sh; flashqla_dtype_t o_dtype;
  void* ht; int64_t ht_sn, ht_sh, ht_s2, ht_s3; flashqla_dtype_t ht_dtype;  // nullptr: not written
  bool state_v_first;
  bool use_qk_l2norm;
  int beta_activation;  // flashqla_beta_activation_t
  // Sequence pieces (fused kernel and piece scan only).
  int piece_pass;         // ForwardPass
  int64_t piece_chunks;   // chunks per piece
  int64_t piece_slots;    // piece slots per value head: an upper bound on the pieces of all sequences
  float* piece_states;    // workspace, [piece_slots][HV][kPieceStateKinds][K][V]; the transition stored transposed
                          // (chained pieces: [N][HV][K][V], a chain's latest end state)
  unsigned* chain_counters;  // chained pieces: [0] the next ticket, [1 + n HV + hv] the chain's pieces done;
                             // zeroed before the launch
  int2* chain_tickets;       // chained pieces: [piece_slots HV] (place in its round, round); round -1: none
  // The output pass as a programmatic dependent launch of the scan: its producer
  // loads and prepares the first chunks while the scan runs.
  bool programmatic_output_pass;
};

}  // namespace flashqla::cuda
