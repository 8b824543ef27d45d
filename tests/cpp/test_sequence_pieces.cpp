// The sequence-piece plan of the fused forward (src/cuda/sequence_pieces.h):
// host-side arithmetic, checked here on random batches without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <queue>
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
    if (!pl.chained) {
      EXPECT_LT(N * HV, kSms);
    }
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
  EXPECT_EQ(plan(1 << 13, std::vector<int64_t>(4, 1 << 13), 33, false, true).chunks, 0);     // 132 chains
  EXPECT_EQ(plan(512, {512}, 8, false, true).chunks, 0);                                       // 8 chunks
  EXPECT_EQ(plan(1 << 15, {1 << 15}, 8, false, true, 0).chunks, 0);                            // switched off
  EXPECT_EQ(plan_sequence_pieces(1 << 15, 1, 8, false, nullptr, 0, -1, 0).chunks, 0);          // no SM count
  EXPECT_EQ(plan(1 << 15, {1 << 15}, 64, true, true).chunks, 0);  // 64 chains: the extra passes cost more
}

TEST(SequencePieces, ChainedWhenTheLastWaveIsPartlyIdle) {
  // 27B TP1, 8192 x 4 at 48 value heads: 192 chains of 128 chunks on 132 SMs
  // take two waves whole; cut in two and chained, three waves of half length.
  const auto pl = plan(8192, std::vector<int64_t>(4, 8192), 48, false, true);
  EXPECT_TRUE(pl.chained);
  EXPECT_EQ(pl.chunks, 64);
  const std::vector<int64_t> c(4, 128);
  const double whole = flashqla::cuda::estimated_chained_time(c.data(), 4, 48, kSms, 128);
  const double cut = flashqla::cuda::estimated_chained_time(c.data(), 4, 48, kSms, 64);
  EXPECT_DOUBLE_EQ(whole, 2 * (128 + flashqla::cuda::kCtaStartChunks));
  EXPECT_DOUBLE_EQ(cut, 3 * (64 + flashqla::cuda::kCtaStartChunks));
  // The GPU suite's default-plan cases (test_gpu.py) chain on 132 SMs.
  EXPECT_TRUE(plan(2048, std::vector<int64_t>(4, 2048), 48, false, true).chained);
  EXPECT_TRUE(plan(8192, {2048, 0, 952, 2000, 3192}, 48, true, true).chained);
  // Varlen with the lengths unknown plans them as equal; the mode switches.
  EXPECT_TRUE(plan(4 * 8192, std::vector<int64_t>(4, 8192), 48, true, false).chained);
  EXPECT_EQ(plan(8192, std::vector<int64_t>(4, 8192), 48, false, true, 0).chunks, 0);
  const auto forced = plan(300, {300}, 2, false, true, 2, 2);  // chained although 2 chains
  EXPECT_TRUE(forced.chained);
  EXPECT_EQ(forced.chunks, 2);
  EXPECT_FALSE(plan(300, {300}, 2, false, true, 1, 2).chained);
  // Chained pieces rank varlen sequences on the device: at most 512 of them.
  EXPECT_EQ(plan(600 * 64, std::vector<int64_t>(600, 64), 1, true, true, 2, 4).chunks, 0);
}

// The chained schedule CTA by CTA: a free SM takes the next ticket and holds it
// until its predecessor's end state is there and the piece is done.
double greedy_chained_time(std::vector<int64_t> chunks, int64_t HV, int64_t sms, int64_t L) {
  std::sort(chunks.begin(), chunks.end(), std::greater<int64_t>());
  std::priority_queue<double, std::vector<double>, std::greater<double>> free_at;
  for (int64_t s = 0; s < sms; ++s) free_at.push(0.0);
  std::vector<double> done(chunks.size() * size_t(HV), 0.0);
  double end = 0;
  for (int64_t j = 0;; ++j) {
    bool any = false;
    for (size_t r = 0; r < chunks.size(); ++r) {
      if (j >= std::max<int64_t>(1, (chunks[r] + L - 1) / L)) continue;
      any = true;
      const double length = double(std::min(L, chunks[r] - j * L)) + flashqla::cuda::kCtaStartChunks;
      for (int64_t h = 0; h < HV; ++h) {
        double& chain = done[r * size_t(HV) + size_t(h)];
        chain = std::max(free_at.top(), chain) + length;
        free_at.pop();
        free_at.push(chain);
        end = std::max(end, chain);
      }
    }
    if (!any) return end;
  }
}

TEST(SequencePieces, ChainedEstimateFollowsTheCtaByCtaSchedule) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t N = 1 + rng() % 8, HV = 8 + rng() % 64;
    const auto ch = chunks_of(random_lengths(rng, 64 + rng() % 40000, N));
    for (int64_t L : {4, 16, 64, 1000}) {
      const double greedy = greedy_chained_time(ch, HV, kSms, L);
      EXPECT_NEAR(flashqla::cuda::estimated_chained_time(ch.data(), N, HV, kSms, L), greedy, 1e-9 * greedy)
          << "N=" << N << " HV=" << HV << " L=" << L;
    }
  }
}

TEST(SequencePieces, ChainedScheduleWaitsForThePredecessor) {
  // One chain of 3 pieces on many SMs: the pieces run one after another.
  const std::vector<int64_t> c{12};
  EXPECT_DOUBLE_EQ(flashqla::cuda::estimated_chained_time(c.data(), 1, 1, kSms, 4),
                   3 * (4 + flashqla::cuda::kCtaStartChunks));
  // Never below the work's share of an SM, and a chained plan is only taken
  // where the model finds it 5% faster than whole sequences.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t N = 1 + rng() % 8, HV = 16 + rng() % 64;
    const auto lengths = random_lengths(rng, 64 + rng() % 40000, N);
    int64_t T = 0;
    for (int64_t len : lengths) T += len;
    const auto ch = chunks_of(lengths);
    double work = 0;
    int64_t longest = 0;
    for (int64_t x : ch) work += double(x) * double(HV), longest = std::max(longest, x);
    for (int64_t L : {4, 16, 64}) {
      EXPECT_GE(flashqla::cuda::estimated_chained_time(ch.data(), N, HV, kSms, L) + 1e-9, work / kSms);
    }
    const auto pl = plan(T, lengths, HV, true, true);
    if (!pl.chained || longest == 0) continue;
    EXPECT_GE(N * HV, kSms);
    EXPECT_LT(flashqla::cuda::estimated_chained_time(ch.data(), N, HV, kSms, pl.chunks),
              0.95 * flashqla::cuda::estimated_chained_time(ch.data(), N, HV, kSms, longest) + 1e-9);
  }
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
