// Which forward calls go to the fused sm_90a kernel (src/cuda/fused_forward_support.h):
// host-only rules, checked without a GPU. The GPU suite checks that both kernels
// meet the oracle; this pins down where the line between them runs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cuda/fused_forward_support.h"

namespace flashqla_test {
namespace {

using flashqla::cuda::ForwardArgs;
using flashqla::cuda::fused_forward_refusal;
using flashqla::cuda::fused_forward_supports;
using ::testing::HasSubstr;
using flashqla::cuda::fused_output_tensor_storable;

void* fake_address(uintptr_t a) { return reinterpret_cast<void*>(a); }

// Two sequences of 64 tokens, H = 2, HV = 4, K = V = 128, contiguous bf16
// [B, T, heads, 128] tensors at 256-byte aligned (never dereferenced) addresses.
ForwardArgs supported_call() {
  ForwardArgs a{};
  a.T = 64, a.H = 2, a.HV = 4, a.K = 128, a.V = 128, a.N = 2, a.group = 2;
  a.token_dtype = FLASHQLA_DTYPE_BFLOAT16;
  a.q = fake_address(0x10000), a.q_sb = 64 * 2 * 128, a.q_st = 2 * 128, a.q_sh = 128;
  a.k = fake_address(0x20000), a.k_sb = 64 * 2 * 128, a.k_st = 2 * 128, a.k_sh = 128;
  a.v = fake_address(0x30000), a.v_sb = 64 * 4 * 128, a.v_st = 4 * 128, a.v_sh = 128;
  a.o = fake_address(0x40000), a.o_sb = 64 * 4 * 128, a.o_st = 4 * 128, a.o_sh = 128;
  a.o_dtype = FLASHQLA_DTYPE_BFLOAT16;
  return a;
}

TEST(FusedForwardSupport, ContiguousBf16AndFp16) {
  ForwardArgs a = supported_call();
  EXPECT_TRUE(fused_forward_supports(a));
  a.token_dtype = a.o_dtype = FLASHQLA_DTYPE_FLOAT16;
  EXPECT_TRUE(fused_forward_supports(a));
}

TEST(FusedForwardSupport, OtherHeadSizesAndDtypesGoToTheSimpleKernel) {
  ForwardArgs a = supported_call();
  a.K = a.V = 64;
  EXPECT_FALSE(fused_forward_supports(a));
  a = supported_call();
  a.V = 256;
  EXPECT_FALSE(fused_forward_supports(a));
  a = supported_call();
  a.token_dtype = a.o_dtype = FLASHQLA_DTYPE_FLOAT32;
  EXPECT_FALSE(fused_forward_supports(a));
  a = supported_call();
  a.o_dtype = FLASHQLA_DTYPE_FLOAT32;  // o in another dtype than q, k, v
  EXPECT_FALSE(fused_forward_supports(a));
}

TEST(FusedForwardSupport, SlicesOfAPackedQkvTensor) {
  // q, k, v as views of one [B, T, (2 H + HV) 128] tensor: token stride of the
  // packed row, heads 128 apart, bases 16-byte aligned.
  ForwardArgs a = supported_call();
  const int64_t row = (2 + 2 + 4) * 128;
  a.q_st = a.k_st = a.v_st = row;
  a.q_sb = a.k_sb = a.v_sb = 64 * row;
  a.k = fake_address(0x10000 + 2 * 128 * 2);
  a.v = fake_address(0x10000 + 4 * 128 * 2);
  EXPECT_TRUE(fused_forward_supports(a));
}

TEST(FusedForwardSupport, UnalignedRowsGoToTheSimpleKernel) {
  ForwardArgs a = supported_call();
  a.q_st = 2 * 128 + 3;  // rows not 16-byte aligned
  EXPECT_FALSE(fused_forward_supports(a));
  a = supported_call();
  a.k = fake_address(0x20000 + 2);
  EXPECT_FALSE(fused_forward_supports(a));
  a = supported_call();
  a.o = fake_address(0x40000 + 2);
  EXPECT_FALSE(fused_forward_supports(a));
  a = supported_call();
  a.o_st = 4 * 128 + 1;
  EXPECT_FALSE(fused_forward_supports(a));
}

TEST(FusedForwardSupport, ZeroStridesOnlyWhereTheExtentIsOne) {
  ForwardArgs a = supported_call();
  a.k_sh = 0;  // k broadcast over its two heads
  EXPECT_FALSE(fused_forward_supports(a));
  a.H = 1, a.group = 4;  // one head: its stride is never stepped
  EXPECT_TRUE(fused_forward_supports(a));

  a = supported_call();
  a.q_sb = 0;  // q broadcast over the two batch rows
  EXPECT_FALSE(fused_forward_supports(a));
  a.cu_seqlens = fake_address(0x50000);  // varlen: one packed row
  EXPECT_TRUE(fused_forward_supports(a));

  a = supported_call();
  a.v_st = 0;
  EXPECT_FALSE(fused_forward_supports(a));
  a.T = 1;
  EXPECT_TRUE(fused_forward_supports(a));
}

// o goes out by tensor stores where its base and strides are 16-byte aligned,
// else by rows: both are the fused kernel's calls.
TEST(FusedForwardSupport, OutputByTensorStoresOnlyWhereAligned) {
  ForwardArgs a = supported_call();
  EXPECT_TRUE(fused_output_tensor_storable(a));
  a.o = fake_address(0x40008);  // 8-byte aligned: by rows
  EXPECT_TRUE(fused_forward_supports(a));
  EXPECT_FALSE(fused_output_tensor_storable(a));

  a = supported_call();
  a.o_st = 4 * 128 + 2;  // rows 4 bytes apart from 16-byte alignment
  EXPECT_TRUE(fused_forward_supports(a));
  EXPECT_FALSE(fused_output_tensor_storable(a));

  a = supported_call();
  a.o_sh = 136;  // o a slice of a wider tensor: strides still multiples of 16 bytes
  a.o_st = 4 * 136, a.o_sb = 64 * 4 * 136;
  EXPECT_TRUE(fused_output_tensor_storable(a));
  a.o_sb = 0;  // broadcast over two batch rows: never written so
  EXPECT_FALSE(fused_output_tensor_storable(a));
  a.cu_seqlens = fake_address(0x50000);  // one packed row: its stride is never stepped
  EXPECT_TRUE(fused_output_tensor_storable(a));
}

TEST(FusedForwardSupport, TokenIndicesFitInt32) {
  ForwardArgs a = supported_call();
  a.N = 1;
  a.T = (int64_t(1) << 31) - 1;
  EXPECT_TRUE(fused_forward_supports(a));
  a.T = int64_t(1) << 31;
  EXPECT_FALSE(fused_forward_supports(a));
}

// Every refusal is the first rule the call breaks, named so a caller can act on
// it; a supported call has none.
TEST(FusedForwardSupport, RefusalsNameTheFirstBrokenRule) {
  ForwardArgs a = supported_call();
  EXPECT_EQ(fused_forward_refusal(a), "");

  a.K = 64;
  EXPECT_EQ(fused_forward_refusal(a), "K = 64: the fused kernel needs K = V = 128");
  a.V = 64;
  EXPECT_EQ(fused_forward_refusal(a), "K = 64, V = 64: the fused kernel needs K = V = 128");
  a = supported_call();
  a.V = 256;
  EXPECT_EQ(fused_forward_refusal(a), "V = 256: the fused kernel needs K = V = 128");
  a.token_dtype = FLASHQLA_DTYPE_FLOAT32;  // the head size is the first rule
  EXPECT_THAT(fused_forward_refusal(a), HasSubstr("V = 256"));

  a = supported_call();
  a.token_dtype = a.o_dtype = FLASHQLA_DTYPE_FLOAT32;
  EXPECT_EQ(fused_forward_refusal(a), "q, k and v are float32: the fused kernel needs bfloat16 or float16");
  a = supported_call();
  a.o_dtype = FLASHQLA_DTYPE_FLOAT32;
  EXPECT_EQ(fused_forward_refusal(a),
            "o is float32 and q, k and v are bfloat16: the fused kernel writes o in their dtype");

  a = supported_call();
  a.N = 1, a.T = int64_t(1) << 31;
  EXPECT_THAT(fused_forward_refusal(a), HasSubstr("T = 2147483648"));
  EXPECT_THAT(fused_forward_refusal(a), HasSubstr("32 bits"));
}

TEST(FusedForwardSupport, RefusalsNameTheTensorAndStride) {
  ForwardArgs a = supported_call();
  a.k = fake_address(0x20000 + 2);
  EXPECT_EQ(fused_forward_refusal(a),
            "k's base address is not 16-byte aligned: the fused kernel loads q, k and v by TMA");

  a = supported_call();
  a.q_st = 2 * 128 + 4;  // a row of q padded by 4 elements: 520 bytes apart
  EXPECT_EQ(fused_forward_refusal(a),
            "q's token stride (260 elements, 520 bytes) is not a positive multiple of 16 bytes: the fused kernel "
            "loads q, k and v by TMA");
  a = supported_call();
  a.v_sb = 8 * 3 + 4;
  EXPECT_THAT(fused_forward_refusal(a), HasSubstr("v's batch stride (28 elements, 56 bytes)"));
  a = supported_call();
  a.k_sh = 0;  // broadcast over two heads
  EXPECT_THAT(fused_forward_refusal(a), HasSubstr("k's head stride (0 elements, 0 bytes) is not a positive multiple"));
  a = supported_call();
  a.q_sb = int64_t(1) << 39;  // a multiple of 16 bytes, past TMA's range
  EXPECT_THAT(fused_forward_refusal(a), HasSubstr("q's batch stride"));
  EXPECT_THAT(fused_forward_refusal(a), HasSubstr("2^40-byte limit"));

  // Bases come before strides, batch strides before token strides.
  a = supported_call();
  a.v_st = 3;
  a.q_sb = 3;
  EXPECT_THAT(fused_forward_refusal(a), HasSubstr("q's batch stride"));
  a.v = fake_address(0x30000 + 8);
  EXPECT_THAT(fused_forward_refusal(a), HasSubstr("v's base address"));

  a = supported_call();
  a.o = fake_address(0x40000 + 2);
  EXPECT_EQ(fused_forward_refusal(a),
            "o's base address is not 4-byte aligned: the fused kernel writes o in pairs of elements");
  a = supported_call();
  a.o_st = 4 * 128 + 1;
  EXPECT_EQ(fused_forward_refusal(a),
            "o's token stride (513 elements) is odd: the fused kernel writes o in pairs of elements");
}

// fused_forward_supports is the refusal's absence on every case above and below.
TEST(FusedForwardSupport, SupportsIsNoRefusal) {
  ForwardArgs a = supported_call();
  for (int64_t stride : {0, 1, 2, 8, 16, 264, 256, 1 << 20}) {
    a.q_st = stride;
    EXPECT_EQ(fused_forward_supports(a), fused_forward_refusal(a).empty()) << stride;
    a.o_sh = stride + 1;
    EXPECT_EQ(fused_forward_supports(a), fused_forward_refusal(a).empty()) << stride;
  }
}

}  // namespace
}  // namespace flashqla_test
