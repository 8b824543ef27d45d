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
using flashqla::cuda::sequence_pieces_pay;

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

TEST(SequencePieces, SlotsBoundThePiecesAndThePartialPassFitsOneWave) {
  std::mt19937 rng(7);
  int planned = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const bool varlen = trial % 2 == 0;
    const int64_t N = 1 + rng() % 16, HV = 1 << (rng() % 7);
    const int64_t T = 1 + rng() % 70000;  // tokens per sequence, or in total (varlen)
    const auto plan = plan_sequence_pieces(T, N, HV, varlen, kSms, 0);
    if (plan.chunks == 0) continue;
    ++planned;
    EXPECT_LT(N * HV, kSms);
    const std::vector<int64_t> lengths = varlen ? random_lengths(rng, T, N) : std::vector<int64_t>(N, T);
    int64_t pieces = 0, cut_pieces = 0;
    for (int64_t len : lengths) {
      const int64_t p = sequence_piece_count(len, plan.chunks);
      EXPECT_GE(p, 1);
      EXPECT_LE((p - 1) * plan.chunks * 64, len) << "a piece past the end of the sequence";
      EXPECT_GE(p * plan.chunks * 64, len) << "tokens not covered by any piece";
      pieces += p;
      cut_pieces += p - 1;  // pieces with a partial-pass CTA pair (all but each sequence's last)
    }
    EXPECT_LE(pieces, plan.slots) << "T=" << T << " N=" << N << " HV=" << HV << " varlen=" << varlen;
    EXPECT_LE(2 * cut_pieces * HV, kSms) << "the partial pass needs more than one wave";
  }
  EXPECT_GT(planned, 200);
}

TEST(SequencePieces, WholeSequencesWhenTheChainsFillTheGpuOrNothingCanBeCut) {
  EXPECT_EQ(plan_sequence_pieces(1 << 15, 4, 64, false, kSms, 0).chunks, 0);   // 256 chains
  EXPECT_EQ(plan_sequence_pieces(512, 1, 8, false, kSms, 0).chunks, 0);        // 8 chunks: one piece
  EXPECT_EQ(plan_sequence_pieces(1 << 15, 1, 8, false, 0, 0).chunks, 0);       // no SM count
  const auto plan = plan_sequence_pieces(1 << 15, 1, 8, false, kSms, 0);        // 397B TP8 1x32768
  EXPECT_EQ(plan.chunks, 63);
  EXPECT_EQ(sequence_piece_count(1 << 15, plan.chunks), 9);
}

TEST(SequencePieces, ForcedPieceLengthAndEmptySequences) {
  const auto plan = plan_sequence_pieces(300, 1, 2, false, kSms, 2);
  EXPECT_EQ(plan.chunks, 2);
  EXPECT_EQ(sequence_piece_count(300, 2), 3);  // chunks of 64, 64 | 64, 64 | 44
  EXPECT_EQ(sequence_piece_count(0, 2), 1);
  EXPECT_EQ(sequence_piece_count(128, 2), 1);
  EXPECT_EQ(sequence_piece_count(129, 2), 2);
}

TEST(SequencePieces, ByDefaultOnlyWhereFewChainsLeaveMostSmsIdle) {
  EXPECT_TRUE(sequence_pieces_pay(1, 8, kSms));    // 397B TP8, one sequence
  EXPECT_TRUE(sequence_pieces_pay(1, 32, kSms));   // 32 chains: a quarter of the SMs
  EXPECT_FALSE(sequence_pieces_pay(1, 64, kSms));  // 397B TP1: the pieces' extra passes cost more
  EXPECT_FALSE(sequence_pieces_pay(8, 8, kSms));
  EXPECT_FALSE(sequence_pieces_pay(1, 1, 0));      // no GPU known
}

}  // namespace
}  // namespace flashqla_test
