// One forward call on the CUDA backend, planned once: the kernel, why not the
// fused one, the sequence-piece plan and the workspace it needs. The workspace
// query, the kernel choice and the launch all read the same plan. Host-only and
// header-only: the device's facts (its SM count) and the environment switches
// come in as arguments, so the planning is unit-tested without a GPU
// (tests/cpp/test_forward_plan.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/problem.h"
#include "cuda/forward_args.h"
#include "cuda/fused_forward_support.h"
#include "cuda/sequence_pieces.h"

namespace flashqla::cuda {

// Bytes of workspace the debug check of cu_seqlens uses (one result word,
// padded to an alignment every later workspace user can build on).
constexpr size_t kCuSeqlensCheckBytes = 256;

// The environment switches that steer the plan (the backend reads them).
struct PlanSwitches {
  bool force_simple = false;    // FLASHQLA_FORWARD_KERNEL=simple: the simple kernel on every call
  int sequence_parallel = -1;   // FLASHQLA_SEQUENCE_PARALLEL: -1 (unset) the cost model, 0 never, 1 always, 2 chained
  int64_t piece_chunks = 0;     // FLASHQLA_PIECE_CHUNKS: > 0 fixes the piece length
};

// The pieces' workspace after the debug check word: the states (piece passes:
// kPieceStateKinds a piece slot and value head; chained pieces: one a chain),
// then, for chained pieces, the ticket table and the ticket and chain counters.
struct PieceWorkspace {
  size_t states = 0, tickets = 0, counters = 0, end = 0;  // byte offsets from the workspace's start
};

inline PieceWorkspace piece_workspace(const Problem& pr, const PiecePlan& plan) {
  PieceWorkspace w;
  const int64_t states = plan.chained ? pr.N * pr.HV : plan.slots * pr.HV * kPieceStateKinds;
  w.states = kCuSeqlensCheckBytes;
  w.tickets = w.states + static_cast<size_t>(states * pr.K * pr.V) * sizeof(float);
  w.counters = w.tickets + (plan.chained ? static_cast<size_t>(plan.slots * pr.HV) * sizeof(int2) : 0);
  w.end = w.counters + (plan.chained ? static_cast<size_t>(1 + pr.N * pr.HV) * sizeof(unsigned) : 0);
  return w;
}

struct ForwardPlan {
  ForwardArgs args;            // the call's sizes, pointers and strides (the launch adds the pieces')
  bool fused = false;          // the fused kernel runs it (else the simple kernel)
  std::string reason;          // why not the fused kernel ("" when it runs)
  PiecePlan pieces;            // pieces.chunks == 0: whole sequences
  bool lengths_guessed = false;  // the piece passes' cut rests on packed sequences' lengths taken as equal
  PieceWorkspace layout;       // where the pieces' state lives in the workspace (when cut)
  size_t workspace_bytes = 0;  // what the call needs
};

// The plan of a validated call `pr` whose arguments are `args`, on a GPU of `sms`
// SMs. Sequence pieces (fused kernel only): where the cost model says they pay,
// from the sequence lengths when the host knows them (no cu_seqlens, one
// sequence, or a host copy given), as if equal otherwise (sequence_pieces.h).
// With fewer chains than SMs, whether and where to cut then rests on that guess
// (on uneven lengths up to 1.9x slower than the plan for the real ones,
// docs/perf.md): the plan says so (lengths_guessed), whether it cut or not.
// Chained pieces (at least as many chains as SMs) add no work whatever the
// lengths and are not flagged.
inline ForwardPlan make_forward_plan(const Problem& pr, const ForwardArgs& args, int64_t sms,
                                     const PlanSwitches& switches) {
  ForwardPlan plan;
  plan.args = args;
  plan.reason = switches.force_simple ? std::string("FLASHQLA_FORWARD_KERNEL=simple runs the simple kernel on every call")
                                      : fused_forward_refusal(args);
  plan.fused = plan.reason.empty();
  if (plan.fused) {
    const bool host_lengths = !pr.cu_seqlens_host.empty();
    plan.pieces = plan_sequence_pieces(pr.T, pr.N, pr.HV, pr.varlen, host_lengths ? pr.cu_seqlens_host.data() : nullptr,
                                       sms, switches.sequence_parallel, switches.piece_chunks);
    const bool cost_model_ran = sms > 0 && switches.sequence_parallel != 0 && switches.piece_chunks <= 0;
    plan.lengths_guessed = cost_model_ran && pr.varlen && pr.N > 1 && !host_lengths &&
                           !chained_pieces(pr.N, pr.HV, sms, switches.sequence_parallel);
  }
  if (plan.pieces.chunks > 0) {
    plan.layout = piece_workspace(pr, plan.pieces);
    plan.workspace_bytes = plan.layout.end;
  } else {
    plan.workspace_bytes = pr.debug_check_cu_seqlens ? kCuSeqlensCheckBytes : 0;
  }
  return plan;
}

}  // namespace flashqla::cuda
