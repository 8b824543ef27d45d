// Whether the tensor-core backward cuts its two chains into sequence pieces
// (backward_chain_pieces.h), and at which length and width: a model of the
// chains and of the grads kernel (the part of the backward pieces change), from
// host-known sizes only. Host-only and header-only (unit-tested without a GPU).
//
// What pieces trade. Cut into pieces of L chunks, a sequence's chains take two
// passes of L chunks each instead of one of all its chunks, but do more work:
// per V tile, pass 1 runs the state chain's first piece, the gradient chain's
// last and three CTAs for each piece between (both chains from zero and the
// transition), pass 2 the other pieces again from their true starts, with the
// piece scan between (one step a middle piece). And the grads kernel runs after
// the chains, where without pieces it runs beside them on the SMs few chains
// leave idle (grads_beside_chains). So pieces pay only where the chains are few
// and long and the grads' work small next to them: one or two value heads of a
// long sequence, not the 4 value heads of a sequence at TP 8 (the model's own
// verdict, docs/perf_backward.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/backward_support.h"
#include "cuda/sequence_pieces.h"

namespace flashqla::cuda {

// The model's costs in µs, fitted (least squares on the change from the
// whole-sequence plan, the grads' cost held at a profile's 20 µs) to a sweep of
// piece lengths 8–128 at 16 and 32 columns on six few-chain shapes (H100,
// `benchmarks/tools/backward_latency` with FLASHQLA_BACKWARD_PIECE_CHUNKS and
// FLASHQLA_BACKWARD_CHAIN_COLUMNS; docs/perf_backward.md): a chain CTA's chunk
// (Nsight: 1.37–1.49 µs at 16 columns, 1.80–1.89 at 32 with few chains), a CTA's
// fixed cost in chunks, a step of the piece scan, the two extra launches, and a
// grads CTA's time per value head of its group (one CTA an SM).
struct BackwardPieceCosts {
  double chain_step_us_16 = 1.4;
  double chain_step_us_32 = 1.7;
  double chain_start_steps = 0.5;
  double scan_step_us = 8.0;
  double piece_launches_us = 3.0;
  double grads_head_us = 20.0;
};

// The chains' time (µs) over sequences of chunks[i] chunks, HV value heads, at
// `columns` (16 or 32) value columns a CTA, one CTA an SM on `sms` SMs, cut
// into pieces of L chunks (0: whole sequences, one pass).
inline double estimated_chains_time(const std::vector<int64_t>& chunks, int64_t HV, int64_t sms, int columns,
                                    int64_t L, const BackwardPieceCosts& k) {
  const double step = columns == 16 ? k.chain_step_us_16 : k.chain_step_us_32;
  const double o = k.chain_start_steps;
  const double ctas = double(128 / columns) * double(HV);  // CTAs a (sequence, chain, piece role)
  double work1 = 0, longest1 = 0, work2 = 0, longest2 = 0;
  int64_t most_pieces = 1;
  for (const int64_t c : chunks) {
    const int64_t q = L > 0 ? std::max<int64_t>(1, (c + L - 1) / L) : 1;
    most_pieces = std::max(most_pieces, q);
    if (q == 1) {  // both chains whole, in the one pass (pass 1 when cut)
      work1 += 2 * ctas * (double(c) + o);
      longest1 = std::max(longest1, double(c) + o);
      continue;
    }
    const double piece = double(L) + o, last = double(c - (q - 1) * L) + o;
    // Pass 1: the state chain's first piece, the gradient chain's last, three a middle piece.
    work1 += ctas * (piece + last + 3 * double(q - 2) * piece);
    longest1 = std::max({longest1, piece, last});
    // Pass 2: the gradient chain's pieces but the last, the state chain's but the first.
    work2 += ctas * (double(q - 1) * piece + double(q - 2) * piece + last);
    longest2 = std::max({longest2, piece, last});
  }
  double t = (pass_time(work1, longest1, sms) + pass_time(work2, longest2, sms)) * step;
  if (most_pieces > 1) t += k.piece_launches_us + k.scan_step_us * double(std::max<int64_t>(0, most_pieces - 2));
  return t;
}

// The grads kernel's time (µs) after the chains, or beside them (`beside`:
// chain_ctas CTAs hold their SMs for `chains_us`; a chunk's grads can start once
// both chains have passed it, the middle of a sequence first, so the idle SMs
// take items from about half-way through the chains; the rest run after them).
// A CTA a (chunk, q/k head), its group's value heads in turn.
inline double estimated_grads_time(const std::vector<int64_t>& chunks, int64_t HK, int64_t group, int64_t sms,
                                   bool beside, int64_t chain_ctas_running, double chains_us,
                                   const BackwardPieceCosts& k) {
  double items = 0;
  for (const int64_t c : chunks) items += double(c) * double(HK);
  const double item_us = double(group) * k.grads_head_us;
  if (items <= 0) return 0;
  if (beside) {
    const double idle = double(std::max<int64_t>(0, sms - chain_ctas_running));
    const double during = std::floor(idle * 0.5 * chains_us / item_us);
    items = std::max(0.0, items - during);
    if (items <= 0) return item_us;  // the last items' tail after the chains
  }
  return pass_time(items * item_us, item_us, sms);
}

// Whether the model tries pieces at all: only where the whole-sequence chains
// (at 32 columns) leave half the SMs idle.
inline bool backward_pieces_considered(int64_t N, int64_t HV, int64_t sms) {
  return leave_half_the_sms_idle(chain_ctas(N, HV, 32), int(sms));
}

struct BackwardPiecePlan {
  int64_t piece_chunks = 0;  // 0: whole sequences
  int columns = 32;          // the chains' value columns a CTA
  bool grads_beside = false;
  double estimated_us = 0;   // chains and grads, the model's
};

// The plan the model finds fastest: whole sequences at the width and grads
// placement of chains_value_columns / grads_beside_chains, or pieces (grads
// after) at 16 or 32 columns and the best length. Pieces are tried only where
// the whole-sequence chains leave half the SMs idle (few chains) and must gain
// 10% (the model's costs are a profile's, not the call's).
inline BackwardPiecePlan best_backward_pieces(const std::vector<int64_t>& chunks, int64_t HV, int64_t HK, int64_t sms,
                                              const BackwardPieceCosts& k = {}) {
  BackwardPiecePlan best;
  const int64_t N = int64_t(chunks.size());
  if (N == 0 || HV <= 0 || HK <= 0 || sms <= 0) return best;
  const int64_t group = HV / HK;
  best.columns = chains_value_columns(N, HV, int(sms), 0);
  best.grads_beside = grads_beside_chains(N, HV, best.columns, int(sms), -1);
  const double whole_chains = estimated_chains_time(chunks, HV, sms, best.columns, 0, k);
  best.estimated_us = whole_chains + estimated_grads_time(chunks, HK, group, sms, best.grads_beside,
                                                          chain_ctas(N, HV, best.columns), whole_chains, k);
  if (!backward_pieces_considered(N, HV, sms)) return best;
  const double grads_after = estimated_grads_time(chunks, HK, group, sms, false, 0, 0, k);
  double bar = 0.9 * best.estimated_us;
  for (const int columns : {16, 32}) {
    for_each_piece_length(longest_of(chunks.data(), N), kMaxPiecesPerSequence, [&](int64_t L) {
      const double t = estimated_chains_time(chunks, HV, sms, columns, L, k) + grads_after;
      if (t < bar) {
        bar = t;
        best = {L, columns, false, t};
      }
      return true;
    });
  }
  return best;
}

}  // namespace flashqla::cuda
