// Which forward calls the fused sm_90a kernel (gdn_fwd_fused_sm90.cu) covers;
// the simple kernel runs everything else. Host-only and header-only, so the
// rules are unit-tested without a GPU (tests/cpp/test_fused_forward_support.cpp).
#pragma once

#include <cstdint>
#include <initializer_list>

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

inline bool fused_forward_supports(const ForwardArgs& a) {
  auto aligned = [](const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  if (a.K != kFusedHeadDim || a.V != kFusedHeadDim) return false;
  if (a.token_dtype != FLASHQLA_DTYPE_BFLOAT16 && a.token_dtype != FLASHQLA_DTYPE_FLOAT16) return false;
  if (a.o_dtype != a.token_dtype) return false;
  // q, k and v come in by TMA (sm90/token_tensor_map.h): 16-byte aligned bases,
  // strides that are positive multiples of 16 bytes along every dimension a
  // tile steps (a broadcast view's zero stride goes to the simple kernel), and
  // 32-bit token coordinates.
  if (a.T >= (int64_t(1) << 31)) return false;
  for (const void* p : {a.q, a.k, a.v})
    if (!aligned(p, 16)) return false;
  const int64_t rows = token_rows(a);
  for (int64_t s : {a.q_sb, a.k_sb, a.v_sb})
    if (!tma_stride_ok(rows, s)) return false;
  for (int64_t s : {a.q_st, a.k_st, a.v_st})
    if (!tma_stride_ok(a.T, s)) return false;
  if (!tma_stride_ok(a.H, a.q_sh) || !tma_stride_ok(a.H, a.k_sh) || !tma_stride_ok(a.HV, a.v_sh)) return false;
  // o is written as pairs of elements.
  if (!aligned(a.o, 4) || a.o_sb % 2 != 0 || a.o_st % 2 != 0 || a.o_sh % 2 != 0) return false;
  return true;
}

// Whether the fused kernel writes o's whole chunks by TMA tensor stores (one a
// state warpgroup a chunk; sm90/token_tensor_map.h): the same alignment rules
// as q, k and v's loads. Otherwise (a supported call with o's strides or base
// not 16-byte aligned) it writes o row by row.
inline bool fused_output_tensor_storable(const ForwardArgs& a) {
  return reinterpret_cast<uintptr_t>(a.o) % 16 == 0 && tma_stride_ok(token_rows(a), a.o_sb) &&
         tma_stride_ok(a.T, a.o_st) && tma_stride_ok(a.HV, a.o_sh);
}

}  // namespace flashqla::cuda
