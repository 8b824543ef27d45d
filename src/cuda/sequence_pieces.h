// How the fused forward cuts sequences into pieces (intra-card sequence
// parallelism, forward_args.h): the host plan from host-known sizes only (what
// the device code shares with it: sequence_piece_layout.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "cuda/sequence_piece_layout.h"

namespace flashqla::cuda {

constexpr int64_t kMinPieceChunks = 4;

struct PiecePlan {
  int64_t chunks = 0;    // chunks per piece; 0: whole sequences
  int64_t slots = 0;     // piece slots per value head: >= the pieces of all sequences together
  bool chained = false;  // pieces one after another in one launch (else: the two piece passes)
};

// Per-sequence chunk counts a piece plan (forward or backward) plans for: from
// cu_seqlens_host when given (N + 1 token offsets), otherwise each sequence taken
// as T / N tokens (varlen) or T (padded batch).
inline std::vector<int64_t> planned_sequence_chunks(int64_t T, int64_t N, bool varlen,
                                                    const int64_t* cu_seqlens_host) {
  std::vector<int64_t> chunks(size_t(std::max<int64_t>(N, 0)), 0);
  for (int64_t i = 0; i < N; ++i) {
    const int64_t tokens = !varlen ? T
                           : cu_seqlens_host != nullptr ? cu_seqlens_host[i + 1] - cu_seqlens_host[i]
                                                        : (T + N - 1) / N;
    chunks[size_t(i)] = (tokens + kPieceChunkTokens - 1) / kPieceChunkTokens;
  }
  return chunks;
}

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

inline int64_t longest_of(const int64_t* chunks, int64_t n) {
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i) longest = std::max(longest, chunks[i]);
  return longest;
}

// The piece lengths the planners try: the longest sequence cut into 2 ..
// max_pieces pieces (at least kMinPieceChunks chunks each), each length once;
// `try_length(L)` returns false to stop.
template <typename F>
inline void for_each_piece_length(int64_t longest, int64_t max_pieces, F&& try_length) {
  int64_t last = 0;
  for (int64_t p = 2; p <= max_pieces; ++p) {
    const int64_t L = std::max(kMinPieceChunks, (longest + p - 1) / p);
    if (L >= longest || L == last) continue;
    last = L;
    if (!try_length(L)) return;
  }
}

// --- chained pieces (chains >= SMs) ---------------------------------------------
// With at least as many chains as SMs, the chains' last wave may leave SMs idle
// (192 chains on 132 SMs take two full waves). Chained pieces fill it without
// extra work: one launch, a CTA a piece, taken in round order (round j: piece j
// of every sequence that has one, all value heads), each CTA starting from the
// end state its predecessor (one round earlier) left in the workspace. The time
// is the greedy list schedule of that order: a free SM takes the next piece and
// holds it until the predecessor's state is there and the piece is done.
// Sequences ranked longest first (the ranks' order within a round does not
// matter for the schedule's correctness, only for its length).
constexpr int64_t kMaxChainedTickets = 1 << 15;  // the model's simulation bound

// The schedule keeps equal times together as (time, how many): the SMs' free
// times in a map, and per sequence its value heads' chain ends, ascending. The
// heads of a sequence have the same pieces and take SMs in head order, so a run
// of heads whose SMs free up together and whose chains end together is one step
// (the per-CTA greedy, at O(groups) steps: the plan stays cheap on the host).
inline double estimated_chained_time(const int64_t* chunks, int64_t n, int64_t HV, int64_t sms, int64_t L) {
  using Groups = std::vector<std::pair<double, int64_t>>;
  std::vector<int64_t> order(chunks, chunks + n);
  std::sort(order.begin(), order.end(), std::greater<int64_t>());
  std::map<double, int64_t> free_at{{0.0, sms}};
  std::vector<Groups> done(size_t(n), Groups{{0.0, HV}});  // each sequence's chain ends
  double end = 0;
  for (int64_t j = 0;; ++j) {
    bool any = false;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t q = std::max<int64_t>(1, (order[size_t(r)] + L - 1) / L);
      if (j >= q) continue;
      any = true;
      const double length = double(std::min(L, order[size_t(r)] - j * L)) + kCtaStartChunks;
      const Groups& chains = done[size_t(r)];
      Groups ends;
      size_t c = 0;
      int64_t c_left = chains[0].second;
      for (int64_t left = HV; left > 0;) {
        auto sm = free_at.begin();
        const int64_t k = std::min({left, sm->second, c_left});
        const double finish = std::max(sm->first, chains[c].first) + length;
        if ((sm->second -= k) == 0) free_at.erase(sm);
        free_at[finish] += k;
        if (!ends.empty() && ends.back().first == finish) {
          ends.back().second += k;
        } else {
          ends.emplace_back(finish, k);
        }
        left -= k, c_left -= k;
        if (c_left == 0 && ++c < chains.size()) c_left = chains[c].second;
      }
      end = std::max(end, ends.back().first);
      done[size_t(r)].swap(ends);
    }
    if (!any) return end;
  }
}

// Tickets (CTAs) of a chained plan of these sequences.
inline int64_t chained_tickets(const int64_t* chunks, int64_t n, int64_t HV, int64_t L) {
  int64_t pieces = 0;
  for (int64_t i = 0; i < n; ++i) pieces += std::max<int64_t>(1, (chunks[i] + L - 1) / L);
  return pieces * HV;
}

// The chained piece length the model finds fastest (0: whole sequences are);
// with `must_cut`, the fastest that cuts the longest sequence.
inline int64_t best_chained_chunks(const int64_t* chunks, int64_t n, int64_t HV, int64_t sms, bool must_cut) {
  const int64_t longest = longest_of(chunks, n);
  if (longest <= 0) return 0;
  // No cut beats whole sequences by 5% when these are within 5% of the work's
  // share of an SM (and past a few waves, the model is not run at all).
  double work = 0;
  for (int64_t i = 0; i < n; ++i) work += double(chunks[i]) * double(HV);
  const double whole = estimated_chained_time(chunks, n, HV, sms, longest);
  if (!must_cut && (n * HV > 8 * sms || 0.95 * whole <= work / double(sms) + kCtaStartChunks)) return 0;
  int64_t best = 0;
  // Whole sequences, longest first: the same schedule with one piece each. A cut
  // must gain 5% to be taken (the model does not see the state hand-over).
  double best_time = must_cut ? 1e300 : 0.95 * whole;
  for_each_piece_length(longest, 8, [&](int64_t L) {
    if (chained_tickets(chunks, n, HV, L) > kMaxChainedTickets) return false;
    const double t = estimated_chained_time(chunks, n, HV, sms, L);
    if (t < best_time) best_time = t, best = L;
    return true;
  });
  return best;
}

// The piece length the model finds fastest for these sequences (0: whole
// sequences); with `must_cut`, the fastest that cuts the longest sequence.
inline int64_t best_piece_chunks(const int64_t* chunks, int64_t n, int64_t HV, int64_t sms, bool must_cut) {
  int64_t best = 0;
  double best_time = must_cut ? 1e300 : estimated_forward_time(chunks, n, HV, sms, 0);
  for_each_piece_length(longest_of(chunks, n), kMaxPiecesPerSequence, [&](int64_t L) {
    const double t = estimated_forward_time(chunks, n, HV, sms, L);
    if (t < best_time) best_time = t, best = L;
    return true;
  });
  return best;
}

// Whether the plan for N sequences of HV value heads on `sms` SMs chains its
// pieces (at least as many chains as SMs, or mode 2) rather than running them in
// two passes. Chained pieces add no work whatever the sequence lengths; the piece
// passes' cut rests on them.
inline bool chained_pieces(int64_t N, int64_t HV, int64_t sms, int mode) { return mode == 2 || N * HV >= sms; }

// The plan for N sequences (varlen: T tokens in total, lengths from
// `cu_seqlens_host` when given — N + 1 token offsets — otherwise taken as equal;
// not varlen: T tokens each) and HV value heads on a GPU with `sms` SMs.
// Fewer chains than SMs: the two piece passes; at least as many: chained pieces.
// `mode` < 0: where the model says they pay, 1: always (the model's best cut),
// 2: chained pieces always (also with few chains: a test of the hand-over), 0:
// never. forced_chunks > 0 fixes the piece length. The slot count bounds the
// pieces of any lengths that sum to T, so a captured graph stays in bounds when
// cu_seqlens changes.
inline PiecePlan plan_sequence_pieces(int64_t T, int64_t N, int64_t HV, bool varlen, const int64_t* cu_seqlens_host,
                                      int64_t sms, int mode, int64_t forced_chunks) {
  if (sms <= 0 || N <= 0 || HV <= 0 || mode == 0) return {};
  const bool chained = chained_pieces(N, HV, sms, mode);
  // Chained pieces rank varlen sequences on the device (work_scheduler.cuh).
  if (chained && varlen && N > kMaxRankedSequences) return {};
  const int64_t longest = (T + kPieceChunkTokens - 1) / kPieceChunkTokens;  // the longest possible sequence
  // A bound on the chunks of all sequences together (varlen: partial last chunks).
  const int64_t total = varlen ? longest + N : N * longest;
  int64_t chunks = forced_chunks;
  if (chunks <= 0) {
    const std::vector<int64_t> lengths = planned_sequence_chunks(T, N, varlen, cu_seqlens_host);
    chunks = chained ? best_chained_chunks(lengths.data(), N, HV, sms, mode > 0)
                     : best_piece_chunks(lengths.data(), N, HV, sms, mode > 0);
  }
  if (chunks <= 0 || chunks >= longest) return {};
  if (chained && (longest + chunks - 1) / chunks > kMaxChainRounds) return {};
  // Σ max(1, ⌈c_n / chunks⌉) <= Σ (c_n / chunks + 1) <= ⌈total / chunks⌉ + N.
  return {chunks, (total + chunks - 1) / chunks + N, chained};
}

}  // namespace flashqla::cuda
