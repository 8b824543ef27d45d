// How the fused forward cuts sequences into pieces (intra-card sequence
// parallelism, forward_args.h): the plan from host-known sizes only, and the
// piece count of one sequence, shared by the host plan and the device code.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__CUDACC__)
#define FLASHQLA_HOST_DEVICE __host__ __device__
#else
#define FLASHQLA_HOST_DEVICE
#endif

namespace flashqla::cuda {

constexpr int64_t kPieceChunkTokens = 64;
constexpr int64_t kMinPieceChunks = 8;

// Pieces of a sequence of `tokens` tokens: at least one, so an empty sequence
// still writes its final state.
FLASHQLA_HOST_DEVICE inline int64_t sequence_piece_count(int64_t tokens, int64_t piece_chunks) {
  const int64_t chunks = (tokens + kPieceChunkTokens - 1) / kPieceChunkTokens;
  const int64_t pieces = (chunks + piece_chunks - 1) / piece_chunks;
  return pieces > 1 ? pieces : 1;
}

struct PiecePlan {
  int64_t chunks = 0;  // chunks per piece; 0: whole sequences
  int64_t slots = 0;   // piece slots per value head: >= the pieces of all sequences together
};

// Whether cutting sequences pays by default: the pieces cost two more passes
// over the data (partial states, then outputs), so they win only where the
// whole-sequence chains leave most SMs idle. Measured on the H200 (132 SMs,
// one sequence of 8192 or 32768 tokens): 3.5x faster at 8 chains, 1.9x at 16,
// 1.4x at 24, even at 32, 0.5x at 64. Pieces by default up to a quarter of
// the SMs in chains.
FLASHQLA_HOST_DEVICE inline bool sequence_pieces_pay(int64_t N, int64_t HV, int64_t sms) {
  return sms > 0 && 4 * N * HV <= sms;
}

// T tokens per sequence (varlen: in total), N sequences, HV value heads, on a
// GPU with `sms` SMs; forced_chunks > 0 fixes the piece length. Whole sequences
// when the chains already fill the GPU or no sequence can be cut.
inline PiecePlan plan_sequence_pieces(int64_t T, int64_t N, int64_t HV, bool varlen, int64_t sms,
                                      int64_t forced_chunks) {
  if (sms <= 0 || N * HV >= sms) return {};
  const int64_t longest = (T + kPieceChunkTokens - 1) / kPieceChunkTokens;  // the longest possible sequence
  // A bound on the chunks of all sequences together (varlen: partial last chunks).
  const int64_t total = varlen ? longest + N : N * longest;
  // The partial pass runs two CTAs a piece (end state and transition): pieces are
  // sized so that it fits one wave of CTAs, which leaves the output pass half a wave.
  int64_t chunks = std::max(kMinPieceChunks, (2 * total * HV + sms - 1) / sms);
  if (forced_chunks > 0) chunks = forced_chunks;
  if (chunks >= longest) return {};
  // Σ max(1, ⌈c_n / chunks⌉) <= Σ (c_n / chunks + 1) <= ⌈total / chunks⌉ + N.
  return {chunks, (total + chunks - 1) / chunks + N};
}

}  // namespace flashqla::cuda
