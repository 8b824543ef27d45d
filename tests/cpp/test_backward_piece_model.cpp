// The model that decides whether the tensor-core backward cuts its chains into
// sequence pieces (src/cuda/backward_piece_model.h): what it must hold whatever
// its costs, and where its verdict turns (on H100-like costs, 132 SMs).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/backward_piece_model.h"

namespace flashqla_test {
namespace {

namespace fc = flashqla::cuda;

constexpr int64_t kSms = 132;

TEST(BackwardPieceModel, NeverCutsWhereTheChainsFillHalfTheGpu) {
  // 16 / 32 heads, 8 / 16, 4 / 8 at one to eight sequences: 128 chain CTAs at 32
  // columns or more.
  for (int64_t HV : {8, 16, 32}) {
    for (int64_t N : {1, 2, 8}) {
      const std::vector<int64_t> chunks(size_t(N), 512 / N);
      const fc::BackwardPiecePlan p = fc::best_backward_pieces(chunks, HV, HV / 2, kSms);
      EXPECT_EQ(p.piece_chunks, 0) << "HV " << HV << " N " << N;
      EXPECT_EQ(p.columns, fc::chains_value_columns(N, HV, int(kSms), 0));
      EXPECT_EQ(p.grads_beside, fc::grads_beside_chains(N, HV, p.columns, int(kSms), -1));
    }
  }
}

TEST(BackwardPieceModel, CutsALongSequenceOfOneOrTwoValueHeads) {
  // One sequence of 8K to 256K tokens, one q/k head: the chains are 8 to 16
  // CTAs, thousands of chunks long, the grads small beside them.
  for (int64_t HV : {1, 2}) {
    for (int64_t chunks : {128, 512, 4096}) {
      const fc::BackwardPiecePlan p = fc::best_backward_pieces({chunks}, HV, 1, kSms);
      EXPECT_GT(p.piece_chunks, 0) << "HV " << HV << " chunks " << chunks;
      EXPECT_LT(p.piece_chunks, chunks);
      EXPECT_GE(p.piece_chunks, fc::kMinPieceChunks);
      EXPECT_FALSE(p.grads_beside) << "the grads run after cut chains";
      const fc::BackwardPiecePlan whole = fc::best_backward_pieces({4}, HV, 1, kSms);  // too short to cut
      EXPECT_EQ(whole.piece_chunks, 0);
    }
  }
}

TEST(BackwardPieceModel, ACutGainsAtLeastTenPercentInTheModel) {
  const fc::BackwardPieceCosts k;
  for (int64_t HV : {1, 2, 4}) {
    for (int64_t chunks : {16, 64, 128, 512, 2048}) {
      const std::vector<int64_t> c{chunks};
      const fc::BackwardPiecePlan p = fc::best_backward_pieces(c, HV, 1, kSms, k);
      const int columns = fc::chains_value_columns(1, HV, int(kSms), 0);
      const bool beside = fc::grads_beside_chains(1, HV, columns, int(kSms), -1);
      const double whole_chains = fc::estimated_chains_time(c, HV, kSms, columns, 0, k);
      const double whole = whole_chains + fc::estimated_grads_time(c, 1, HV, kSms, beside,
                                                                   fc::chain_ctas(1, HV, columns), whole_chains, k);
      if (p.piece_chunks > 0) {
        EXPECT_LE(p.estimated_us, 0.9 * whole) << "HV " << HV << " chunks " << chunks;
      } else {
        EXPECT_DOUBLE_EQ(p.estimated_us, whole);
      }
    }
  }
}

TEST(BackwardPieceModel, ChainsTimeCountsEachPassAndTheScan) {
  // One value head at 32 columns: 4 V tiles. Whole: both chains, 8 CTAs of
  // c + start steps, one wave.
  fc::BackwardPieceCosts k;
  k.chain_step_us_32 = 1.0, k.chain_start_steps = 2.0, k.scan_step_us = 5.0, k.piece_launches_us = 7.0;
  EXPECT_DOUBLE_EQ(fc::estimated_chains_time({100}, 1, kSms, 32, 0, k), 102.0);
  // Pieces of 25 chunks: four, two in the middle. Pass 1: 4 x (1 + 1 + 3 x 2)
  // = 32 CTAs of 27 steps; pass 2: 4 x (3 + 3) = 24 CTAs of 27; two scan steps.
  EXPECT_DOUBLE_EQ(fc::estimated_chains_time({100}, 1, kSms, 32, 25, k), 27.0 + 27.0 + 7.0 + 2 * 5.0);
  // On 16 SMs pass 1's 32 CTAs take two waves, pass 2's 24 two.
  EXPECT_DOUBLE_EQ(fc::estimated_chains_time({100}, 1, 16, 32, 25, k), 2 * 27.0 + 2 * 27.0 + 7.0 + 2 * 5.0);
  // A short last piece: 90 chunks in pieces of 25 (25, 25, 25, 15).
  EXPECT_DOUBLE_EQ(fc::estimated_chains_time({90}, 1, kSms, 32, 25, k), 27.0 + 27.0 + 7.0 + 2 * 5.0);
  // Two pieces: no middle, no scan step.
  EXPECT_DOUBLE_EQ(fc::estimated_chains_time({50}, 1, kSms, 32, 25, k), 27.0 + 27.0 + 7.0);
}

TEST(BackwardPieceModel, SequenceChunksFromHostOffsetsOrEqualShares) {
  const std::vector<int64_t> cu{0, 64, 65, 1000};
  EXPECT_EQ(fc::planned_sequence_chunks(1000, 3, true, cu.data()), (std::vector<int64_t>{1, 1, 15}));
  EXPECT_EQ(fc::planned_sequence_chunks(1000, 3, true, nullptr), (std::vector<int64_t>{6, 6, 6}));
  EXPECT_EQ(fc::planned_sequence_chunks(1000, 2, false, nullptr), (std::vector<int64_t>{16, 16}));
}

}  // namespace
}  // namespace flashqla_test
