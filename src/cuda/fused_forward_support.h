// Which forward calls the fused sm_90a kernel (gdn_fwd_fused_sm90.cu) covers,
// and why not where it does not; the simple kernel runs everything else.
// Host-only and header-only, so the rules and their reasons are unit-tested
// without a GPU (tests/cpp/test_fused_forward_support.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/forward_args.h"

namespace flashqla::cuda {

// The fused kernel's fixed head size (K = V).
constexpr int64_t kFusedHeadDim = 128;

// Batch rows of the q, k, v tensors: one packed row with cu_seqlens, else N.
inline int64_t token_rows(const ForwardArgs& a) { return a.cu_seqlens != nullptr ? 1 : a.N; }

// A 16-bit tensor's element stride along a dimension a TMA tile steps: a
// positive multiple of 16 bytes under the tensor map's 2^40-byte limit
// (a dimension of extent 1 is never stepped along).
inline bool tma_stride_ok(int64_t extent, int64_t stride) {
  return extent <= 1 || (stride > 0 && stride % 8 == 0 && stride < (int64_t(1) << 39));
}

// Why the fused kernel does not cover a call: the first of its rules the call
// breaks, as a sentence naming the argument ("" when it covers the call). The
// simple kernel runs such calls; the reason is what
// flashqla_gdn_fwd_kernel_choice() reports.
inline std::string fused_forward_refusal(const ForwardArgs& a) {
  auto aligned = [](const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  if (a.K != kFusedHeadDim || a.V != kFusedHeadDim) {
    const std::string k = str("K = ", a.K), v = str("V = ", a.V);
    return str(a.K != kFusedHeadDim && a.V != kFusedHeadDim ? k + ", " + v : a.K != kFusedHeadDim ? k : v,
               ": the fused kernel needs K = V = ", kFusedHeadDim);
  }
  if (a.token_dtype != FLASHQLA_DTYPE_BFLOAT16 && a.token_dtype != FLASHQLA_DTYPE_FLOAT16) {
    return str("q, k and v are ", dtype_name(a.token_dtype), ": the fused kernel needs bfloat16 or float16");
  }
  if (a.o_dtype != a.token_dtype) {
    return str("o is ", dtype_name(a.o_dtype), " and q, k and v are ", dtype_name(a.token_dtype),
               ": the fused kernel writes o in their dtype");
  }
  // q, k and v come in by TMA (sm90/token_tensor_map.h): 16-byte aligned bases,
  // strides that are positive multiples of 16 bytes along every dimension a
  // tile steps (a broadcast view's zero stride goes to the simple kernel), and
  // 32-bit token coordinates.
  if (a.T >= (int64_t(1) << 31)) {
    return str("T = ", a.T, ": the fused kernel indexes tokens in 32 bits (T < 2^31)");
  }
  const struct {
    const char* name;
    const void* data;
    int64_t stride[3];
    int64_t heads;
  } tokens[] = {{"q", a.q, {a.q_sb, a.q_st, a.q_sh}, a.H},
                {"k", a.k, {a.k_sb, a.k_st, a.k_sh}, a.H},
                {"v", a.v, {a.v_sb, a.v_st, a.v_sh}, a.HV}};
  constexpr const char* tma = ": the fused kernel loads q, k and v by TMA";
  for (const auto& x : tokens) {
    if (!aligned(x.data, 16)) return str(x.name, "'s base address is not 16-byte aligned", tma);
  }
  constexpr const char* dims[] = {"batch", "token", "head"};
  const int64_t element_bytes = 2;  // bfloat16 / float16
  for (int d = 0; d < 3; ++d) {
    const int64_t extent = d == 0 ? token_rows(a) : d == 1 ? a.T : 0;
    for (const auto& x : tokens) {
      const int64_t s = x.stride[d];
      if (tma_stride_ok(d == 2 ? x.heads : extent, s)) continue;
      const std::string stride = str(x.name, "'s ", dims[d], " stride (", s, " elements, ", s * element_bytes,
                                     " bytes)");
      if (s > 0 && s % 8 == 0) return str(stride, " is not below TMA's 2^40-byte limit", tma);
      return str(stride, " is not a positive multiple of 16 bytes", tma);
    }
  }
  // o is written as pairs of elements.
  constexpr const char* pairs = ": the fused kernel writes o in pairs of elements";
  if (!aligned(a.o, 4)) return str("o's base address is not 4-byte aligned", pairs);
  const int64_t o_strides[] = {a.o_sb, a.o_st, a.o_sh};
  for (int d = 0; d < 3; ++d) {
    if (o_strides[d] % 2 != 0) return str("o's ", dims[d], " stride (", o_strides[d], " elements) is odd", pairs);
  }
  return {};
}

inline bool fused_forward_supports(const ForwardArgs& a) { return fused_forward_refusal(a).empty(); }

// Whether the fused kernel writes o's whole chunks by TMA tensor stores (one a
// state warpgroup a chunk; sm90/token_tensor_map.h): the same alignment rules
// as q, k and v's loads. Otherwise (a supported call with o's strides or base
// not 16-byte aligned) it writes o row by row.
inline bool fused_output_tensor_storable(const ForwardArgs& a) {
  return reinterpret_cast<uintptr_t>(a.o) % 16 == 0 && tma_stride_ok(token_rows(a), a.o_sb) &&
         tma_stride_ok(a.T, a.o_st) && tma_stride_ok(a.HV, a.o_sh);
}

}  // namespace flashqla::cuda
