// The work-item scheduler of the fused forward (and of the kernels around it):
// what one CTA computes. A work item is a run of chunks of one (sequence, value
// head) with the state it starts from, where its final state goes and whether it
// writes o and reads v. One scheduler type a pass of the forward (ForwardPass),
// each with the same interface:
//   static int64_t grid_size(const ForwardArgs&)                     (host)
//   static WorkItem item(const ForwardArgs&, int64_t block, int64_t* scratch)
// Whole sequences are ranked longest first; sequence pieces (intra-card sequence
// parallelism, forward_args.h) are found from cu_seqlens on the device, so no
// pass needs a host read.
#pragma once

#include <cstdint>

#include "cuda/forward_args.h"
#include "cuda/sequence_piece_layout.h"
#include "cuda/sm90/device_common.cuh"

namespace flashqla::cuda {

// A state tensor element (x = key row, c = value column) at base + x sx + c sc.
struct StateSource {
  enum Mode { kZero, kLoad, kIdentity };
  Mode mode = kZero;
  const void* ptr = nullptr;
  flashqla_dtype_t dtype = FLASHQLA_DTYPE_FLOAT32;
  int64_t base = 0, sx = 0, sc = 0;
  __device__ float load(int x, int c) const {
    if (mode == kIdentity) return x == c ? 1.f : 0.f;
    return mode == kLoad ? load_float(ptr, dtype, base + x * sx + c * sc) : 0.f;
  }
};

struct StateTarget {
  void* ptr = nullptr;  // nullptr: not written
  flashqla_dtype_t dtype = FLASHQLA_DTYPE_FLOAT32;
  int64_t base = 0, sx = 0, sc = 0;
  __device__ void store(int x, int c, float value) const { store_float(ptr, dtype, base + x * sx + c * sc, value); }
};

// Chained pieces: the chain's counter of pieces done. The state warpgroups wait
// until it reaches `wait_for` before they read the start state, and with
// `signal` raise it once the end state is stored.
struct ChainLink {
  unsigned* counter = nullptr;  // nullptr: not a chained piece
  unsigned wait_for = 0;
  bool signal = false;
};

struct WorkItem {
  bool valid = false;
  int64_t n = 0, hv = 0;
  SequenceRange seq{};
  int64_t chunk_begin = 0, chunk_end = 0;  // chunks of the sequence, [begin, end)
  bool read_v = true, write_o = true;
  StateSource init;
  StateTarget final_state;
  bool true_start = false;  // runs from the sequence's true state (its checkpoints are its to write)
  ChainLink link;
};

constexpr int kWorkItemChunk = static_cast<int>(kPieceChunkTokens);

__device__ __forceinline__ int64_t chunk_count(const SequenceRange& r) {
  return (r.eos - r.bos + kWorkItemChunk - 1) / kWorkItemChunk;
}

// Rank -> sequence index, longest first (ties: lower index first). All threads
// of the CTA call it (it synchronises); scratch holds kMaxRankedSequences + 1
// int64 values.
__device__ inline int64_t sequence_of_rank(const ForwardArgs& a, int64_t rank, int64_t* scratch) {
  if (a.cu_seqlens == nullptr || a.N <= 1 || a.N > kMaxRankedSequences) return rank;
  const int n_seq = int(a.N);
  for (int i = threadIdx.x; i < n_seq; i += blockDim.x) {
    const SequenceRange r = sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, i);
    scratch[i] = r.eos - r.bos;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_seq; i += blockDim.x) {
    const int64_t li = scratch[i];
    int64_t r = 0;
    for (int m = 0; m < n_seq; ++m) r += (scratch[m] > li) || (scratch[m] == li && m < i);
    if (r == rank) scratch[kMaxRankedSequences] = i;
  }
  __syncthreads();
  const int64_t n = scratch[kMaxRankedSequences];
  __syncthreads();
  return n;
}

__device__ __forceinline__ int64_t piece_count(const ForwardArgs& a, const SequenceRange& r) {
  return sequence_piece_count(r.eos - r.bos, a.piece_chunks);
}

// Piece slot -> (sequence, piece index, pieces of that sequence); false past the last piece.
__device__ inline bool find_piece(const ForwardArgs& a, int64_t slot, int64_t& n, int64_t& j, int64_t& pieces) {
  int64_t before = 0;
  for (int64_t m = 0; m < a.N; ++m) {
    const int64_t p = piece_count(a, sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, m));
    if (slot < before + p) {
      n = m, j = slot - before, pieces = p;
      return true;
    }
    before += p;
  }
  return false;
}

// Sequence n's initial state and final state in the user's tensors (row n, or
// its slot of a state pool; none for a negative slot). With a pool updated in
// place the row's read precedes its write in every pass: the same CTA (whole
// sequences), the chain's order (chained pieces), or the launches' order
// (piece passes: piece 0 reads in the partial pass, the last piece writes in
// the output pass).
__device__ inline StateSource user_initial_state(const ForwardArgs& a, int64_t n, int64_t hv) {
  StateSource s;
  if (a.h0 == nullptr) return s;
  const int64_t row = state_row(a.state_indices, a.state_indices_int64, a.pool_slots, n);
  if (row < 0) return s;
  s.mode = StateSource::kLoad;
  s.ptr = a.h0, s.dtype = a.h0_dtype, s.base = row * a.h0_sn + hv * a.h0_sh;
  s.sx = a.state_v_first ? a.h0_s3 : a.h0_s2;
  s.sc = a.state_v_first ? a.h0_s2 : a.h0_s3;
  return s;
}

__device__ inline StateTarget user_final_state(const ForwardArgs& a, int64_t n, int64_t hv) {
  StateTarget t;
  if (a.ht == nullptr) return t;
  const int64_t row = state_row(a.state_indices, a.state_indices_int64, a.pool_slots, n);
  if (row < 0) return t;
  t.ptr = a.ht, t.dtype = a.ht_dtype, t.base = row * a.ht_sn + hv * a.ht_sh;
  t.sx = a.state_v_first ? a.ht_s3 : a.ht_s2;
  t.sc = a.state_v_first ? a.ht_s2 : a.ht_s3;
  return t;
}

// Row of sequence n's first checkpoint: Σ_{m<n} floor(len_m / (64 e)).
__device__ inline int64_t checkpoint_row0(const ForwardArgs& a, int64_t n) {
  const int64_t every = int64_t(kWorkItemChunk) * a.ckpt_chunks;
  if (a.cu_seqlens == nullptr) return n * (a.T / every);
  int64_t row = 0;
  for (int64_t m = 0; m < n; ++m) {
    const SequenceRange r = sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, m);
    row += (r.eos - r.bos) / every;
  }
  return row;
}

// Sequence n's checkpoints of value head hv (the target's base: its first row;
// rows ckpt_sn apart), for an item that runs from its true start state
// (WorkItem::true_start).
__device__ inline StateTarget user_checkpoints(const ForwardArgs& a, int64_t n, int64_t hv) {
  StateTarget t;
  if (a.ckpt == nullptr || a.ckpt_chunks <= 0) return t;
  t.ptr = a.ckpt, t.dtype = a.ckpt_dtype, t.base = checkpoint_row0(a, n) * a.ckpt_sn + hv * a.ckpt_sh;
  t.sx = a.state_v_first ? a.ckpt_s3 : a.ckpt_s2;
  t.sc = a.state_v_first ? a.ckpt_s2 : a.ckpt_s3;
  return t;
}

// Offset of a piece state in ForwardArgs::piece_states.
__device__ __forceinline__ int64_t piece_state_base(const ForwardArgs& a, int64_t slot, int64_t hv, int kind) {
  return ((slot * a.HV + hv) * kPieceStateKinds + kind) * a.K * a.V;
}

// A chain's latest end state in the chained pieces' workspace.
__device__ __forceinline__ int64_t chain_state_base(const ForwardArgs& a, int64_t n, int64_t hv) {
  return (n * a.HV + hv) * a.K * a.V;
}

// Chained pieces: CTAs take tickets from a counter, in launch-independent
// order, so a CTA only ever waits for CTAs that hold a smaller ticket and are
// running or done (no deadlock whatever order the hardware starts CTAs in). The
// ticket table (gdn_fwd_chain_tickets_sm90.cu) goes round by round: round j is
// piece j of every sequence with more than j pieces, ranked longest first (those
// are the first ranks), value head fastest. A piece starts from the end state its
// predecessor (one round earlier) stored. Sets `t` to the ticket's place in its
// round and `j` to the round; false past the last ticket.
__device__ inline bool take_chained_ticket(const ForwardArgs& a, int64_t* scratch, int64_t& t, int64_t& j) {
  if (threadIdx.x == 0) scratch[kMaxRankedSequences] = atomicAdd(a.chain_counters, 1u);
  __syncthreads();
  const int2 e = a.chain_tickets[scratch[kMaxRankedSequences]];
  __syncthreads();  // read by all before the ranking reuses scratch
  t = e.x, j = e.y;
  return e.y >= 0;
}

// The sequence passes: whole sequences (the plain forward: CTA t = (sequence of
// rank t / HV, value head t % HV), the longest sequences first), or chained
// pieces (one launch, a CTA a ticket from take_chained_ticket: piece j of a
// sequence starts from the end state piece j − 1 left in the workspace, once
// the chain's counter says it is there, and raises the counter after its own).
__device__ __forceinline__ WorkItem sequence_pass_item(const ForwardArgs& a, int64_t block, int64_t* scratch,
                                                       bool chained) {
  WorkItem w;
  int64_t t = block, j = 0;
  if (chained && !take_chained_ticket(a, scratch, t, j)) return w;
  w.valid = true;
  w.hv = t % a.HV;
  w.n = sequence_of_rank(a, t / a.HV, scratch);
  w.seq = sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, w.n);
  w.chunk_end = chunk_count(w.seq);
  w.init = user_initial_state(a, w.n, w.hv);
  w.final_state = user_final_state(a, w.n, w.hv);
  w.true_start = true;  // every chained piece starts from its true start state
  if (!chained) return w;
  const int64_t pieces = piece_count(a, w.seq);
  w.chunk_begin = j * a.piece_chunks;
  w.chunk_end = min64(w.chunk_end, (j + 1) * a.piece_chunks);
  w.link.counter = a.chain_counters + 1 + w.n * a.HV + w.hv;
  w.link.wait_for = unsigned(j);
  w.link.signal = j + 1 < pieces;
  if (j > 0) {
    w.init.mode = StateSource::kLoad;
    w.init.ptr = a.piece_states, w.init.dtype = FLASHQLA_DTYPE_FLOAT32;
    w.init.base = chain_state_base(a, w.n, w.hv);
    w.init.sx = a.V, w.init.sc = 1;
  }
  if (w.link.signal) {
    w.final_state.ptr = a.piece_states, w.final_state.dtype = FLASHQLA_DTYPE_FLOAT32;
    w.final_state.base = chain_state_base(a, w.n, w.hv);
    w.final_state.sx = a.V, w.final_state.sc = 1;
  }
  return w;
}

// The two piece passes around the piece scan. The partial pass (two CTAs a piece
// slot and value head, one a kind): piece 0 in full, o and its end state from
// the true initial state (the whole sequence and its final state when it is the
// only piece); pieces 1 .. last − 1 their end state from zero (kPieceLocal) and
// their transition (kPieceTransition: from the identity with v = 0, stored
// transposed); the last piece nothing yet. The output pass (a CTA a piece slot
// and value head): pieces after the first, each from its true start state; the
// last one writes the final state.
__device__ __forceinline__ WorkItem piece_pass_item(const ForwardArgs& a, int64_t block, bool partials) {
  WorkItem w;
  const int kind = partials ? int(block % 2) : kPieceStart;
  const int64_t rest = partials ? block / 2 : block;
  w.hv = rest % a.HV;
  const int64_t slot = rest / a.HV;
  int64_t j = 0, pieces = 0;
  if (!find_piece(a, slot, w.n, j, pieces)) return w;
  w.seq = sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, w.n);
  w.chunk_begin = j * a.piece_chunks;
  w.chunk_end = min64(chunk_count(w.seq), (j + 1) * a.piece_chunks);
  const bool last = j == pieces - 1;
  if (partials) {
    w.valid = j == 0 ? kind == kPieceLocal : !last;
    w.write_o = j == 0;
    w.read_v = kind == kPieceLocal;
    if (kind == kPieceTransition) {
      w.init.mode = StateSource::kIdentity;
    } else if (j == 0) {
      w.init = user_initial_state(a, w.n, w.hv);
      w.true_start = kind == kPieceLocal;  // piece 0 in full, from the true initial state
    }
    if (j == 0 && last) {
      w.final_state = user_final_state(a, w.n, w.hv);
      return w;
    }
    w.final_state.ptr = a.piece_states;
    w.final_state.base = piece_state_base(a, slot, w.hv, kind);
    w.final_state.sx = kind == kPieceTransition ? 1 : a.V;
    w.final_state.sc = kind == kPieceTransition ? a.K : 1;
    return w;
  }
  w.valid = j > 0;
  w.init.mode = StateSource::kLoad;
  w.init.ptr = a.piece_states;
  w.init.base = piece_state_base(a, slot, w.hv, kPieceStart);
  w.init.sx = a.V, w.init.sc = 1;
  if (last) w.final_state = user_final_state(a, w.n, w.hv);
  w.true_start = true;
  return w;
}

struct WholeSequenceScheduler {
  static int64_t grid_size(const ForwardArgs& a) { return a.N * a.HV; }
  __device__ static WorkItem item(const ForwardArgs& a, int64_t block, int64_t* scratch) {
    return sequence_pass_item(a, block, scratch, false);
  }
};
struct ChainedPieceScheduler {
  static int64_t grid_size(const ForwardArgs& a) { return a.piece_slots * a.HV; }
  __device__ static WorkItem item(const ForwardArgs& a, int64_t block, int64_t* scratch) {
    return sequence_pass_item(a, block, scratch, true);
  }
};
struct PiecePartialScheduler {
  static int64_t grid_size(const ForwardArgs& a) { return a.piece_slots * a.HV * 2; }
  __device__ static WorkItem item(const ForwardArgs& a, int64_t block, int64_t*) {
    return piece_pass_item(a, block, true);
  }
};
struct PieceOutputScheduler {
  static int64_t grid_size(const ForwardArgs& a) { return a.piece_slots * a.HV; }
  __device__ static WorkItem item(const ForwardArgs& a, int64_t block, int64_t*) {
    return piece_pass_item(a, block, false);
  }
};

// CTAs a launch of a pass needs.
inline int64_t work_item_count(const ForwardArgs& a) {
  switch (a.piece_pass) {
    case kPiecePartials: return PiecePartialScheduler::grid_size(a);
    case kPieceOutputs: return PieceOutputScheduler::grid_size(a);
    case kChainedPieces: return ChainedPieceScheduler::grid_size(a);
    default: return WholeSequenceScheduler::grid_size(a);
  }
}

// The work item of CTA `block` in a launch of pass a.piece_pass. All threads of
// the CTA call it with the same arguments (the whole-sequence ranking and the
// chained tickets synchronise the CTA). One call site a pair of passes that share
// their code (the kernel sits at its register limit: four inlined copies cost
// it spills).
__device__ __forceinline__ WorkItem resolve_work_item(const ForwardArgs& a, int64_t block, int64_t* scratch) {
  if (a.piece_pass == kWholeSequences || a.piece_pass == kChainedPieces)
    return sequence_pass_item(a, block, scratch, a.piece_pass == kChainedPieces);
  return piece_pass_item(a, block, a.piece_pass == kPiecePartials);
}

}  // namespace flashqla::cuda
