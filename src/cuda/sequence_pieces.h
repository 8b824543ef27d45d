// How the fused forward cuts sequences into pieces (intra-card sequence
// parallelism, forward_args.h): the plan from host-known sizes only, and the
// piece count of one sequence, shared by the host plan and the device code.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define FLASHQLA_HOST_DEVICE __host__ __device__
#else
#define FLASHQLA_HOST_DEVICE
#endif

namespace flashqla::cuda {

constexpr int64_t kPieceChunkTokens = 64;
constexpr int64_t kMinPieceChunks = 4;

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

// --- the cost model that picks the piece length ---------------------------------
// Time in units of one chunk of a chain (the fused kernel's per-chunk latency).
// Cut into pieces of L chunks, a sequence of c chunks has q = ⌈c / L⌉ pieces;
// the partial pass runs piece 0 in full (o and its end state) and pieces
// 1 .. q − 2 twice (end state from zero, transition), the output pass reruns
// pieces 1 .. q − 1 from their true start states; a sequence of one piece runs
// whole in the partial pass. A pass of CTAs at most `longest` long takes
// ⌈work / (SMs · longest)⌉ waves of `longest` (the fused kernel holds one CTA an
// SM). kCtaStartChunks is a CTA's fixed cost (initial state, pipeline fill,
// final state), kPiecePassesChunks the extra launches, kScanStepChunks one step
// of the piece scan (one per piece after the first of the longest sequence).
// Fitted to benchmarks/sweep_pieces.py on the H200 (docs/perf.md).
constexpr double kCtaStartChunks = 3.5;
constexpr double kPiecePassesChunks = 1.0;
constexpr double kScanStepChunks = 1.0;
constexpr int64_t kMaxPiecesPerSequence = 32;

inline double pass_time(double work, double longest, int64_t sms) {
  if (longest <= 0) return 0;
  const double waves = work / (double(sms) * longest);
  return std::max(1.0, double(int64_t(waves - 1e-9) + 1)) * longest;
}

// Estimated time of the forward over sequences of chunks[0..n) chunks, HV value
// heads each, on `sms` SMs, cut into pieces of L chunks (0: whole sequences).
inline double estimated_forward_time(const int64_t* chunks, int64_t n, int64_t HV, int64_t sms, int64_t L) {
  const double o = kCtaStartChunks;
  double work1 = 0, longest1 = 0, work2 = 0, longest2 = 0;
  int64_t most_pieces = 1;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = chunks[i];
    const int64_t q = L > 0 ? std::max<int64_t>(1, (c + L - 1) / L) : 1;
    most_pieces = std::max(most_pieces, q);
    if (q == 1) {
      work1 += (double(c) + o) * double(HV);
      longest1 = std::max(longest1, double(c) + o);
      continue;
    }
    const double last = double(c - (q - 1) * L) + o;  // the last piece
    work1 += (double(L) + o) * double(2 * q - 3) * double(HV);
    longest1 = std::max(longest1, double(L) + o);
    work2 += (last + (double(L) + o) * double(q - 2)) * double(HV);
    longest2 = std::max({longest2, last, q > 2 ? double(L) + o : 0.0});
  }
  const double pieces = most_pieces > 1 ? kPiecePassesChunks + kScanStepChunks * double(most_pieces - 1) : 0.0;
  return pass_time(work1, longest1, sms) + pass_time(work2, longest2, sms) + pieces;
}

// The piece length the model finds fastest for these sequences (0: whole
// sequences); with `must_cut`, the fastest that cuts the longest sequence.
inline int64_t best_piece_chunks(const int64_t* chunks, int64_t n, int64_t HV, int64_t sms, bool must_cut) {
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i) longest = std::max(longest, chunks[i]);
  int64_t best = 0;
  double best_time = must_cut ? 1e300 : estimated_forward_time(chunks, n, HV, sms, 0);
  int64_t last = 0;
  for (int64_t p = 2; p <= kMaxPiecesPerSequence; ++p) {
    const int64_t L = std::max(kMinPieceChunks, (longest + p - 1) / p);
    if (L >= longest || L == last) continue;
    last = L;
    const double t = estimated_forward_time(chunks, n, HV, sms, L);
    if (t < best_time) best_time = t, best = L;
  }
  return best;
}

// The plan for N sequences (varlen: T tokens in total, lengths from
// `cu_seqlens_host` when given — N + 1 token offsets — otherwise taken as equal;
// not varlen: T tokens each) and HV value heads on a GPU with `sms` SMs.
// Pieces only where the chains are fewer than the SMs; `mode` < 0: where the
// model says they pay, > 0: always (the model's best cut). forced_chunks > 0
// fixes the piece length. The slot count bounds the pieces of any lengths that
// sum to T, so a captured graph stays in bounds when cu_seqlens changes.
inline PiecePlan plan_sequence_pieces(int64_t T, int64_t N, int64_t HV, bool varlen, const int64_t* cu_seqlens_host,
                                      int64_t sms, int mode, int64_t forced_chunks) {
  if (sms <= 0 || N <= 0 || N * HV >= sms || mode == 0) return {};
  const int64_t longest = (T + kPieceChunkTokens - 1) / kPieceChunkTokens;  // the longest possible sequence
  // A bound on the chunks of all sequences together (varlen: partial last chunks).
  const int64_t total = varlen ? longest + N : N * longest;
  int64_t chunks = forced_chunks;
  if (chunks <= 0) {
    std::vector<int64_t> lengths(size_t(N), 0);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t tokens = !varlen ? T
                             : cu_seqlens_host != nullptr ? cu_seqlens_host[i + 1] - cu_seqlens_host[i]
                                                          : (T + N - 1) / N;
      lengths[size_t(i)] = (tokens + kPieceChunkTokens - 1) / kPieceChunkTokens;
    }
    chunks = best_piece_chunks(lengths.data(), N, HV, sms, mode > 0);
  }
  if (chunks <= 0 || chunks >= longest) return {};
  // Σ max(1, ⌈c_n / chunks⌉) <= Σ (c_n / chunks + 1) <= ⌈total / chunks⌉ + N.
  return {chunks, (total + chunks - 1) / chunks + N};
}

}  // namespace flashqla::cuda
