// The sequence-piece plan of the fused forward (src/cuda/sequence_pieces.h):
// host-side arithmetic, checked here on random batches without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "cuda/sequence_pieces.h"

namespace flashqla_test {
namespace {

using flashqla::cuda::plan_sequence_pieces;
using flashqla::cuda::sequence_piece_count;

constexpr int64_t kSms = 132;

// Sequence lengths summing to T: n - 1 random cut points, some of them equal
// (empty sequences).
std::vector<int64_t> random_lengths(std::mt19937& rng, int64_t T, int64_t n) {
  std::uniform_int_distribution<int64_t> cut(0, T);
  std::vector<int64_t> cuts{0, T};
  for (int64_t i = 1; i < n; ++i) cuts.push_back(cut(rng));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> lengths;
  for (size_t i = 1; i < cuts.size(); ++i) lengths.push_back(cuts[i] - cuts[i - 1]);
  return lengths;
}

// The plan as the backend calls it: lengths known (cu_seqlens_host) or not.
flashqla::cuda::PiecePlan plan(int64_t T, const std::vector<int64_t>& lengths, int64_t HV, bool varlen,
                               bool lengths_known, int mode = -1, int64_t forced = 0) {
  std::vector<int64_t> cu{0};
  for (int64_t len : lengths) cu.push_back(cu.back() + len);
  return plan_sequence_pieces(T, int64_t(lengths.size()), HV, varlen, lengths_known ? cu.data() : nullptr, kSms,
                              mode, forced);
}

std::vector<int64_t> chunks_of(const std::vector<int64_t>& tokens) {
  std::vector<int64_t> c;
  for (int64_t t : tokens) c.push_back((t + 63) / 64);
  return c;
}

TEST(SequencePieces, SlotsBoundThePiecesOfAnyLengths) {
  // The slots come from T and N only: any lengths summing to T fit, so a captured
  // graph stays in bounds when cu_seqlens changes.
  std::mt19937 rng(7);
  int planned = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const bool varlen = trial % 2 == 0;
    const int64_t N = 1 + rng() % 16, HV = 1 << (rng() % 7);
    const int64_t T = 1 + rng() % 70000;  // tokens per sequence, or in total (varlen)
    const std::vector<int64_t> planned_lengths = varlen ? random_lengths(rng, T, N) : std::vector<int64_t>(N, T);
    const auto pl = plan(T, planned_lengths, HV, varlen, trial % 3 != 0, trial % 5 == 0 ? 1 : -1);
    if (pl.chunks == 0) continue;
    ++planned;
    EXPECT_LT(N * HV, kSms);
    EXPECT_GE(pl.chunks, flashqla::cuda::kMinPieceChunks);
    const std::vector<int64_t> lengths = varlen ? random_lengths(rng, T, N) : planned_lengths;
    int64_t pieces = 0;
    for (int64_t len : lengths) {
      const int64_t p = sequence_piece_count(len, pl.chunks);
      EXPECT_GE(p, 1);
      EXPECT_LE((p - 1) * pl.chunks * 64, len) << "a piece past the end of the sequence";
      EXPECT_GE(p * pl.chunks * 64, len) << "tokens not covered by any piece";
      pieces += p;
    }
    EXPECT_LE(pieces, pl.slots) << "T=" << T << " N=" << N << " HV=" << HV << " varlen=" << varlen;
  }
  EXPECT_GT(planned, 300);
}

TEST(SequencePieces, WholeSequencesWhenTheChainsFillTheGpuOrNothingCanBeCut) {
  EXPECT_EQ(plan(1 << 15, {1 << 15, 1 << 15, 1 << 15, 1 << 15}, 64, false, true).chunks, 0);  // 256 chains
  EXPECT_EQ(plan(512, {512}, 8, false, true).chunks, 0);                                       // 8 chunks
  EXPECT_EQ(plan(1 << 15, {1 << 15}, 8, false, true, 0).chunks, 0);                            // switched off
  EXPECT_EQ(plan_sequence_pieces(1 << 15, 1, 8, false, nullptr, 0, -1, 0).chunks, 0);          // no SM count
  EXPECT_EQ(plan(1 << 15, {1 << 15}, 64, true, true).chunks, 0);  // 64 chains: the extra passes cost more
}

TEST(SequencePieces, ForcedPieceLengthAndEmptySequences) {
  EXPECT_EQ(plan(300, {300}, 2, false, true, 1, 2).chunks, 2);
  EXPECT_EQ(sequence_piece_count(300, 2), 3);  // chunks of 64, 64 | 64, 64 | 44
  EXPECT_EQ(sequence_piece_count(0, 2), 1);
  EXPECT_EQ(sequence_piece_count(128, 2), 1);
  EXPECT_EQ(sequence_piece_count(129, 2), 2);
}

TEST(SequencePieces, TheModelCutsFewChainsAndFollowsTheLengths) {
  // 397B TP8, one sequence of 32768 tokens: 8 chains on 132 SMs.
  const auto one = plan(1 << 15, {1 << 15}, 8, true, true);
  ASSERT_GT(one.chunks, 0);
  const auto c = chunks_of({1 << 15});
  EXPECT_LT(flashqla::cuda::estimated_forward_time(c.data(), 1, 8, kSms, one.chunks),
            0.3 * flashqla::cuda::estimated_forward_time(c.data(), 1, 8, kSms, 0));
  // A skewed pair (28672 + 4096 at 24 heads): cut by the long sequence when the
  // lengths are known; taken as two equal halves (which do not pay) otherwise.
  EXPECT_GT(plan(32768, {28672, 4096}, 24, true, true).chunks, 0);
  EXPECT_EQ(plan(32768, {28672, 4096}, 24, true, false).chunks, 0);
  // The estimate never prefers a cut the model thinks slower than whole sequences.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    const int64_t N = 1 + rng() % 4, HV = 8 << (rng() % 3);
    const auto lengths = random_lengths(rng, 64 + rng() % 40000, N);
    int64_t T = 0;
    for (int64_t len : lengths) T += len;
    const auto pl = plan(T, lengths, HV, true, true);
    const auto ch = chunks_of(lengths);
    const double whole = flashqla::cuda::estimated_forward_time(ch.data(), N, HV, kSms, 0);
    if (pl.chunks > 0) {
      EXPECT_LT(flashqla::cuda::estimated_forward_time(ch.data(), N, HV, kSms, pl.chunks), whole);
    }
  }
}

}  // namespace
}  // namespace flashqla_test
