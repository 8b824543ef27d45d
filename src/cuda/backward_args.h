// What every backward kernel receives: the forward's arguments (its o and
// final-state outputs unused), the incoming gradients, the gradient outputs and
// the backward's workspace, resolved from one validated backward call.
#pragma once

#include <cstdint>

#include "cuda/forward_args.h"

namespace flashqla::cuda {

// The fp32 states a sequence piece of the tensor-core chains keeps between its
// passes (BackwardArgs::piece_states), each [128][128] as the chains hold them
// ([key][value]; the transition [key][key]).
enum BackwardPieceState : int {
  kBwdTransition = 0,  // M_j = A_last ⋯ A_first of piece j (A_c = e^{γ_L} I − K̂ᵀ diag(b) W)
  kBwdStateLocal,      // the state chain over piece j from zero
  kBwdGradLocal,       // the gradient chain over piece j from zero
  kBwdStateStart,      // S entering piece j
  kBwdGradEnd,         // dS leaving piece j (entering its last chunk's step)
  kBwdPieceStates
};

struct BackwardArgs {
  ForwardArgs f;  // sizes, inputs and options (f.o and f.ht are not used)
  int64_t B;      // batch rows (the partials are indexed by token)
  // Incoming gradients.
  const void* d_o; int64_t do_sb, do_st, do_sh; flashqla_dtype_t do_dtype;
  const void* dht; int64_t dht_sn, dht_sh, dht_s2, dht_s3; flashqla_dtype_t dht_dtype;  // nullptr: zero
  // Gradient outputs.
  void* dq; int64_t dq_sb, dq_st, dq_sh; flashqla_dtype_t dq_dtype;
  void* dk; int64_t dk_sb, dk_st, dk_sh; flashqla_dtype_t dk_dtype;
  void* dv; int64_t dv_sb, dv_st, dv_sh; flashqla_dtype_t dv_dtype;
  void* dg; int64_t dg_sb, dg_st; flashqla_dtype_t dg_dtype;
  void* dbeta; int64_t dbeta_sb, dbeta_st; flashqla_dtype_t dbeta_dtype;
  void* dh0; int64_t dh0_sn, dh0_sh, dh0_s2, dh0_s3; flashqla_dtype_t dh0_dtype;  // nullptr: not written
  int64_t chunk_slots;  // chunk-state slots a value head (chunk_slot() in the kernels)
  // Workspace of the simple backward (gdn_bwd_simple_sm90.h).
  float* chunk_states;    // [chunk_slots][HV][K][V] fp32
  float* partials;        // [v_tiles][B T][HV][2 K + 2]
  int64_t v_tiles;
  // Workspace of the tensor-core backward (gdn_bwd_tc_sm90.h), bf16 bits:
  // per token and value head, then per chunk slot and value head.
  uint16_t* w;        // [B T][HV][K]   (I + A)⁻¹ diag(β e^γ) K̂
  uint16_t* u0;       // [B T][HV][V]   (I + A)⁻¹ diag(β) V
  uint16_t* z;        // [B T][HV][V]   scale · Pᵀ dO
  uint16_t* minv;     // [B T][HV][64]  the rows of (I + A)⁻¹
  float4* rows;       // [B T][HV]      fp32 (e^{γ_L − γ} r_k, scale e^γ r_q, e^{γ_L}, γ): γ the in-chunk
                      //                cumsum of g, γ_L the chunk's last, r_k, r_q the l2norm factors
  // S entering each chunk and dS leaving it, [chunk_slots][HV] of [K][V] bf16
  // as an mma::CoreTile<bf16, 128> (row r, columns 8 v .. 8 v + 7 at
  // (r / 8) · 1024 + v · 64 + (r % 8) · 8): a chain CTA's columns of an 8-row
  // block are contiguous, one bulk copy from its shared-memory slice.
  uint16_t* states;
  uint16_t* dstates;
  // The grads beside the chains (grads_beside_chains in cuda/backward_support.h):
  // each chain CTA's count of chunks whose states it has stored,
  // [2][N][HV][chain_tiles] (direction 0 the gradient chain, as blockIdx.y; then
  // the CTA's V tile; room for 8 tiles),
  // raised with release semantics; the grads kernel waits on it with acquire.
  // Then one more word: the grads' next-item ticket. nullptr: the grads run
  // after the chains (no counts, no waits, a fixed stride of items a CTA).
  unsigned* chain_progress;
  int chain_tiles;  // V tiles a (sequence, value head): 128 / the chains' columns
  // Sequence pieces of the chains (piece_chunks > 0): each sequence cut into
  // pieces of piece_chunks chunks, both chains run in two passes (chain_pass 1:
  // the first piece of the state chain and the last of the gradient chain in
  // full, the pieces between from zero and from the identity; 2: the rerun of
  // the others from their start states) with a scan between them
  // (launch_gdn_bwd_tc_piece_scan). 0: whole sequences, one pass (chain_pass 0).
  int64_t piece_chunks;
  int64_t max_pieces;   // pieces a sequence at most: the chains' grid and piece_states' rows
  int chain_pass;
  float* piece_states;  // [N][max_pieces][HV][kBwdPieceStates][128][128] fp32
};

}  // namespace flashqla::cuda
