// Which backward calls go to the tensor-core backward (src/cuda/backward_support.h):
// host-only rules, checked without a GPU. The GPU suite checks both backwards
// against the oracle; this pins down where the line between them runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/backward_support.h"

namespace flashqla_test {
namespace {

using flashqla::cuda::BackwardArgs;
using flashqla::cuda::tensor_core_backward_refusal;
using ::testing::HasSubstr;

void* fake_address(uintptr_t a) { return reinterpret_cast<void*>(a); }

// One sequence of 64 tokens, H = 2, HV = 4, K = V = 128, contiguous bf16
// tensors at 256-byte aligned (never dereferenced) addresses.
BackwardArgs supported_call() {
  BackwardArgs a{};
  a.f.T = 64, a.f.H = 2, a.f.HV = 4, a.f.K = 128, a.f.V = 128, a.f.N = 1, a.f.group = 2;
  a.f.token_dtype = FLASHQLA_DTYPE_BFLOAT16;
  a.f.q = fake_address(0x10000), a.f.q_sb = 64 * 2 * 128, a.f.q_st = 2 * 128, a.f.q_sh = 128;
  a.f.k = fake_address(0x20000), a.f.k_sb = 64 * 2 * 128, a.f.k_st = 2 * 128, a.f.k_sh = 128;
  a.f.v = fake_address(0x30000), a.f.v_sb = 64 * 4 * 128, a.f.v_st = 4 * 128, a.f.v_sh = 128;
  a.d_o = fake_address(0x40000), a.do_sb = 64 * 4 * 128, a.do_st = 4 * 128, a.do_sh = 128;
  a.do_dtype = FLASHQLA_DTYPE_BFLOAT16;
  return a;
}

TEST(BackwardSupport, ContiguousBf16HeadSize128) {
  EXPECT_EQ(tensor_core_backward_refusal(supported_call()), "");
  // Gradient outputs, g, beta and states take any dtype: not part of the rule.
  BackwardArgs a = supported_call();
  a.dq_dtype = a.dk_dtype = a.dv_dtype = FLASHQLA_DTYPE_FLOAT32;
  a.f.g_dtype = a.f.beta_dtype = FLASHQLA_DTYPE_FLOAT16;
  EXPECT_EQ(tensor_core_backward_refusal(a), "");
}

TEST(BackwardSupport, OtherHeadSizesAndDtypesGoToTheSimpleBackward) {
  BackwardArgs a = supported_call();
  a.f.K = 64;
  EXPECT_THAT(tensor_core_backward_refusal(a), HasSubstr("K = V = 128"));
  a = supported_call();
  a.f.V = 256;
  EXPECT_THAT(tensor_core_backward_refusal(a), HasSubstr("V = 256"));
  a = supported_call();
  a.f.token_dtype = FLASHQLA_DTYPE_FLOAT16;
  EXPECT_THAT(tensor_core_backward_refusal(a), HasSubstr("bfloat16"));
  a = supported_call();
  a.f.token_dtype = FLASHQLA_DTYPE_FLOAT32;
  EXPECT_THAT(tensor_core_backward_refusal(a), HasSubstr("q, k, v"));
  a = supported_call();
  a.do_dtype = FLASHQLA_DTYPE_FLOAT32;
  EXPECT_THAT(tensor_core_backward_refusal(a), HasSubstr("d_o"));
}

TEST(BackwardSupport, RowsMustBe16ByteAligned) {
  BackwardArgs a = supported_call();
  a.f.q_st = 2 * 128 + 4;  // a packed projection with 4 elements between rows
  EXPECT_THAT(tensor_core_backward_refusal(a), HasSubstr("q: rows must be 16-byte aligned"));
  a = supported_call();
  a.f.k = fake_address(0x20008);
  EXPECT_THAT(tensor_core_backward_refusal(a), HasSubstr("k: rows"));
  a = supported_call();
  a.f.v_sh = 132;
  EXPECT_THAT(tensor_core_backward_refusal(a), HasSubstr("v: rows"));
  a = supported_call();
  a.do_sb = 8 * 4 * 128 + 2;
  EXPECT_THAT(tensor_core_backward_refusal(a), HasSubstr("d_o: rows"));
  // Strides that stay multiples of 8 elements (views of wider rows) are fine.
  a = supported_call();
  a.f.q_st = 3 * 128 + 8;
  EXPECT_EQ(tensor_core_backward_refusal(a), "");
}

// The chains run 16 value columns a CTA only where the 32-column chains (4
// tiles x 2 directions a (sequence, value head)) would fill at most half the
// SMs, so the narrow chains always fit one wave.
TEST(TensorCoreBackwardSupport, ChainsNarrowOnlyWhereFewChainsWouldLeaveSmsIdle) {
  using flashqla::cuda::chains_value_columns;
  EXPECT_EQ(chains_value_columns(1, 4, 132, 0), 16);    // 32 CTAs
  EXPECT_EQ(chains_value_columns(1, 8, 132, 0), 16);    // 64 CTAs: 128 narrow, one wave
  EXPECT_EQ(chains_value_columns(1, 16, 132, 0), 32);   // 128 CTAs: one wave already
  EXPECT_EQ(chains_value_columns(8, 32, 132, 0), 32);
  EXPECT_EQ(chains_value_columns(1, 4, 0, 0), 32);      // SM count unknown
  EXPECT_EQ(chains_value_columns(8, 32, 132, 16), 16);  // forced
  EXPECT_EQ(chains_value_columns(1, 4, 132, 32), 32);
  EXPECT_EQ(chains_value_columns(1, 4, 132, 24), 16);   // not a width: ignored
}

// The grads run beside the chains only where the chain CTAs (one an SM) leave
// half the SMs idle; 0 / 1 force it either way.
TEST(TensorCoreBackwardSupport, GradsBesideChainsOnlyWhereChainsLeaveHalfTheSmsIdle) {
  using flashqla::cuda::grads_beside_chains;
  EXPECT_TRUE(grads_beside_chains(1, 4, 16, 132, -1));     // 64 chain CTAs
  EXPECT_TRUE(grads_beside_chains(1, 8, 32, 132, -1));     // 64
  EXPECT_FALSE(grads_beside_chains(2, 8, 32, 132, -1));    // 128: 4 SMs idle
  EXPECT_FALSE(grads_beside_chains(1, 16, 32, 132, -1));
  EXPECT_FALSE(grads_beside_chains(1, 32, 32, 132, -1));   // 256: two waves
  EXPECT_FALSE(grads_beside_chains(1, 4, 16, 0, -1));      // SM count unknown
  EXPECT_FALSE(grads_beside_chains(1, 4, 16, 132, 0));     // forced
  EXPECT_TRUE(grads_beside_chains(1, 32, 32, 132, 1));
  EXPECT_TRUE(grads_beside_chains(1, 4, 16, 132, 7));      // not 0 or 1: ignored
}

}  // namespace
}  // namespace flashqla_test
