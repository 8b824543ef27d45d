// Which chunks and states one CTA of the tensor-core backward's chains runs
// (gdn_bwd_tc_chains_sm90.cu), for whole sequences or for the sequence pieces
// of its two passes (docs/design.md §5.5). Host and device code: the CPU tests
// walk the passes through it.
#pragma once

#include <cstdint>

#include "cuda/backward_args.h"
#include "cuda/sequence_piece_layout.h"

namespace flashqla::cuda {

// What one chain CTA runs: a whole sequence (no pieces), or one sequence piece
// in one of the two passes (BackwardArgs::piece_chunks, chain_pass). role:
// blockIdx.y, 0 the gradient chain, 1 the state chain, 2 (pass 1 only) the
// state chain's transition over a piece (from the identity, U0 taken as zero).
struct ChainRun {
  bool active = false;
  int64_t c_begin = 0, c_end = 0;  // the chunks it runs, [c_begin, c_end) of the sequence
  enum Init { kFromInput, kFromZero, kFromIdentity, kFromPiece } init = kFromInput;
  int init_kind = 0;               // kFromPiece: BackwardPieceState of this piece
  bool store_chunks = true;        // S or dS of each chunk to the workspace
  bool zero_in = false;            // U0 taken as zero (the transition)
  enum End { kNone, kDh0, kToPiece } end = kNone;
  int end_kind = 0;                // kToPiece: its BackwardPieceState,
  int64_t end_piece = 0;           // of this piece
};

FLASHQLA_HOST_DEVICE inline ChainRun plan_chain_run(const BackwardArgs& a, int role, int64_t j, int64_t n_chunks,
                                                   int64_t tokens) {
  ChainRun r;
  const bool grad = role == 0;
  if (a.piece_chunks == 0 || a.chain_pass == 0) {  // whole sequences
    r.active = role < 2;
    r.c_end = n_chunks;
    r.end = grad ? ChainRun::kDh0 : ChainRun::kNone;
    return r;
  }
  const int64_t P = sequence_piece_count(tokens, a.piece_chunks);
  if (j >= P) return r;
  r.c_begin = j * a.piece_chunks;
  r.c_end = (j + 1) * a.piece_chunks < n_chunks ? (j + 1) * a.piece_chunks : n_chunks;
  const bool first = j == 0, last = j == P - 1, middle = !first && !last;
  if (a.chain_pass == 1) {
    if (P == 1) {  // the sequence whole, in this pass
      r.active = role < 2;
      r.end = grad ? ChainRun::kDh0 : ChainRun::kNone;
      return r;
    }
    if (role == 2) {  // M_j of a middle piece
      r.active = middle;
      r.init = ChainRun::kFromIdentity;
      r.store_chunks = false;
      r.zero_in = true;
      r.end = ChainRun::kToPiece, r.end_kind = kBwdTransition, r.end_piece = j;
    } else if (grad) {  // the last piece in full (its dS: the end gradient of the piece before), the middle from zero
      r.active = last || middle;
      r.init = last ? ChainRun::kFromInput : ChainRun::kFromZero;
      r.store_chunks = last;
      r.end = ChainRun::kToPiece;
      r.end_kind = last ? kBwdGradEnd : kBwdGradLocal;
      r.end_piece = last ? j - 1 : j;
    } else {  // the first piece in full (its S: the next piece's start), the middle from zero
      r.active = first || middle;
      r.init = first ? ChainRun::kFromInput : ChainRun::kFromZero;
      r.store_chunks = first;
      r.end = ChainRun::kToPiece;
      r.end_kind = first ? kBwdStateStart : kBwdStateLocal;
      r.end_piece = first ? j + 1 : j;
    }
    return r;
  }
  // Pass 2: the rest from the states the scan left (the gradient chain's first
  // piece writes d_initial_state).
  if (role == 2 || P == 1) return r;
  r.active = grad ? !last : !first;
  r.init = ChainRun::kFromPiece;
  r.init_kind = grad ? kBwdGradEnd : kBwdStateStart;
  r.end = grad && first ? ChainRun::kDh0 : ChainRun::kNone;
  return r;
}

}  // namespace flashqla::cuda
