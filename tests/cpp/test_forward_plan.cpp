// The CUDA backend's plan of one forward call (src/cuda/forward_plan.h): which
// kernel, why not the fused one, the sequence pieces and the workspace, from the
// call and the GPU's SM count. Host-only, checked without a GPU; the GPU suite
// checks that the launch follows the plan (CudaBackend.KernelChoice*).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda/forward_plan.h"

namespace flashqla_test {
namespace {

using flashqla::Problem;
using flashqla::cuda::ForwardArgs;
using flashqla::cuda::ForwardPlan;
using flashqla::cuda::make_forward_plan;
using flashqla::cuda::PlanSwitches;
using ::testing::HasSubstr;

constexpr int64_t kSms = 132;

void* fake_address(uintptr_t a) { return reinterpret_cast<void*>(a); }

// N sequences (packed with cu_seqlens when `lengths` is given, else N rows of T
// tokens), H = 1 q/k head, HV value heads, K = V = 128, contiguous bf16 tensors at
// aligned (never dereferenced) addresses: the fused kernel's call.
struct Call {
  Problem pr;
  ForwardArgs args{};

  Call(int64_t T, int64_t N, int64_t HV, const std::vector<int64_t>& lengths = {}, bool host_lengths = false) {
    const bool varlen = !lengths.empty();
    pr.B = varlen ? 1 : N, pr.T = T, pr.H = 1, pr.HV = HV, pr.K = 128, pr.V = 128, pr.N = N, pr.group = HV;
    pr.varlen = varlen;
    pr.backend = FLASHQLA_BACKEND_CUDA;
    if (varlen && host_lengths) {
      pr.cu_seqlens_host = {0};
      for (int64_t len : lengths) pr.cu_seqlens_host.push_back(pr.cu_seqlens_host.back() + len);
    }
    args.T = T, args.H = 1, args.HV = HV, args.K = 128, args.V = 128, args.N = N, args.group = HV;
    args.token_dtype = args.o_dtype = FLASHQLA_DTYPE_BFLOAT16;
    args.q = fake_address(0x100000), args.q_sb = T * 128, args.q_st = 128, args.q_sh = 128;
    args.k = fake_address(0x200000), args.k_sb = T * 128, args.k_st = 128, args.k_sh = 128;
    args.v = fake_address(0x300000), args.v_sb = T * HV * 128, args.v_st = HV * 128, args.v_sh = 128;
    args.o = fake_address(0x400000), args.o_sb = T * HV * 128, args.o_st = HV * 128, args.o_sh = 128;
    if (varlen) args.cu_seqlens = fake_address(0x500000);
  }
  ForwardPlan plan(const PlanSwitches& switches = {}) const { return make_forward_plan(pr, args, kSms, switches); }
};

TEST(ForwardPlan, FusedCallWithoutPiecesNeedsNoWorkspace) {
  const ForwardPlan p = Call(128, 256, 4).plan();  // 1024 chains of two chunks: whole sequences
  EXPECT_TRUE(p.fused);
  EXPECT_EQ(p.reason, "");
  EXPECT_EQ(p.pieces.chunks, 0);
  EXPECT_FALSE(p.lengths_guessed);
  EXPECT_EQ(p.workspace_bytes, 0u);
}

TEST(ForwardPlan, OneLongSequenceIsCutIntoPiecePasses) {
  const ForwardPlan p = Call(32768, 1, 4).plan();  // 4 chains of 512 chunks on 132 SMs
  EXPECT_TRUE(p.fused);
  EXPECT_GT(p.pieces.chunks, 0);
  EXPECT_FALSE(p.pieces.chained);
  EXPECT_FALSE(p.lengths_guessed);
  // The states of every piece slot, after the debug check's word.
  EXPECT_EQ(p.layout.states, flashqla::cuda::kCuSeqlensCheckBytes);
  EXPECT_EQ(p.workspace_bytes,
            flashqla::cuda::kCuSeqlensCheckBytes +
                size_t(p.pieces.slots * 4 * flashqla::cuda::kPieceStateKinds * 128 * 128) * sizeof(float));
}

// docs/perf.md's case: 27B TP2, 28672 + 4096 tokens, 48 chains. Taken as two
// sequences of 16384 tokens the plan runs them whole; with the real lengths it
// cuts the long one. The guessed plan is flagged whether it cuts or not.
TEST(ForwardPlan, PackedSequencesWithoutHostLengthsAreFlagged) {
  const std::vector<int64_t> lengths{28672, 4096};
  const Call guessed(32768, 2, 24, lengths, /*host_lengths=*/false);
  const ForwardPlan g = guessed.plan();
  EXPECT_TRUE(g.fused);
  EXPECT_EQ(g.pieces.chunks, 0);
  EXPECT_TRUE(g.lengths_guessed);

  const ForwardPlan known = Call(32768, 2, 24, lengths, /*host_lengths=*/true).plan();
  EXPECT_GT(known.pieces.chunks, 0);
  EXPECT_FALSE(known.pieces.chained);
  EXPECT_FALSE(known.lengths_guessed);

  // Three sequences taken as equal are cut into piece passes: flagged too.
  const ForwardPlan cut = Call(3 * 32768, 3, 4, {90000, 4304, 4000}).plan();
  EXPECT_GT(cut.pieces.chunks, 0);
  EXPECT_FALSE(cut.pieces.chained);
  EXPECT_TRUE(cut.lengths_guessed);

  // Not flagged: one packed sequence (its length is T), rows of T tokens, pieces
  // off or of a fixed length (no lengths steer them)...
  EXPECT_FALSE(Call(32768, 1, 24, {32768}).plan().lengths_guessed);
  EXPECT_FALSE(Call(16384, 2, 24).plan().lengths_guessed);
  PlanSwitches off;
  off.sequence_parallel = 0;
  const ForwardPlan none = guessed.plan(off);
  EXPECT_EQ(none.pieces.chunks, 0);
  EXPECT_FALSE(none.lengths_guessed);
  EXPECT_EQ(none.workspace_bytes, 0u);
  PlanSwitches fixed;
  fixed.piece_chunks = 8;
  EXPECT_FALSE(guessed.plan(fixed).lengths_guessed);
  EXPECT_EQ(guessed.plan(fixed).pieces.chunks, 8);
  // ...and at least as many chains as SMs: chained pieces, no extra work whatever the lengths.
  const ForwardPlan many = Call(32768, 8, 24, {28672, 512, 512, 512, 512, 512, 512, 1536}).plan();
  EXPECT_FALSE(many.lengths_guessed);
}

TEST(ForwardPlan, ManyChainsChainTheirPieces) {
  PlanSwitches chained;
  chained.sequence_parallel = 2;  // chained pieces whatever the chain count
  const Call c(4096, 2, 4);
  const ForwardPlan p = c.plan(chained);
  ASSERT_GT(p.pieces.chunks, 0);
  EXPECT_TRUE(p.pieces.chained);
  // States a chain, then the ticket table and the counters.
  EXPECT_EQ(p.layout.tickets, p.layout.states + size_t(2 * 4 * 128 * 128) * sizeof(float));
  EXPECT_EQ(p.layout.counters, p.layout.tickets + size_t(p.pieces.slots * 4) * sizeof(int2));
  EXPECT_EQ(p.workspace_bytes, p.layout.counters + size_t(1 + 2 * 4) * sizeof(unsigned));
}

TEST(ForwardPlan, SimpleKernelCallsAreNotCutAndSayWhy) {
  Call c(32768, 1, 4);
  c.args.K = c.pr.K = 64;
  const ForwardPlan p = c.plan();
  EXPECT_FALSE(p.fused);
  EXPECT_EQ(p.reason, "K = 64: the fused kernel needs K = V = 128");
  EXPECT_EQ(p.pieces.chunks, 0);
  EXPECT_FALSE(p.lengths_guessed);
  EXPECT_EQ(p.workspace_bytes, 0u);

  PlanSwitches simple;
  simple.force_simple = true;
  const ForwardPlan forced = Call(32768, 1, 4).plan(simple);
  EXPECT_FALSE(forced.fused);
  EXPECT_THAT(forced.reason, HasSubstr("FLASHQLA_FORWARD_KERNEL=simple"));
  EXPECT_EQ(forced.pieces.chunks, 0);
}

TEST(ForwardPlan, DebugCheckNeedsItsWordWithoutPieces) {
  Call c(128, 256, 4);
  c.pr.debug_check_cu_seqlens = true;
  EXPECT_EQ(c.plan().workspace_bytes, flashqla::cuda::kCuSeqlensCheckBytes);
  c.args.K = c.pr.K = 64;  // the simple kernel too
  EXPECT_EQ(c.plan().workspace_bytes, flashqla::cuda::kCuSeqlensCheckBytes);
}

TEST(ForwardPlan, NoSmCountMeansNoPieces) {
  const Call c(32768, 1, 4);
  const ForwardPlan p = make_forward_plan(c.pr, c.args, 0, {});
  EXPECT_TRUE(p.fused);
  EXPECT_EQ(p.pieces.chunks, 0);
}

}  // namespace
}  // namespace flashqla_test
