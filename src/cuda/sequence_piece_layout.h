// What the host plan of sequence pieces (sequence_pieces.h) and the device code
// (sm90/work_scheduler.cuh) share: the chunk a piece counts, the ranking limit
// and the piece count of one sequence. No host containers: device code includes it.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHQLA_HOST_DEVICE __host__ __device__
#else
#define FLASHQLA_HOST_DEVICE
#endif

namespace flashqla::cuda {

constexpr int64_t kPieceChunkTokens = 64;
// Sequences the fused kernel ranks longest first on the device (beyond this, in
// launch order); chained pieces of varlen batches rely on the ranking.
constexpr int kMaxRankedSequences = 512;
// Chained pieces: the most pieces of one sequence (rounds of the ticket table).
constexpr int64_t kMaxChainRounds = 1024;

// Pieces of a sequence of `tokens` tokens: at least one, so an empty sequence
// still writes its final state.
FLASHQLA_HOST_DEVICE inline int64_t sequence_piece_count(int64_t tokens, int64_t piece_chunks) {
  const int64_t chunks = (tokens + kPieceChunkTokens - 1) / kPieceChunkTokens;
  const int64_t pieces = (chunks + piece_chunks - 1) / piece_chunks;
  return pieces > 1 ? pieces : 1;
}

}  // namespace flashqla::cuda
