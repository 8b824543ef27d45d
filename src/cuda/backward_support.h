// Which backward calls the tensor-core backward (gdn_bwd_tc_sm90.h) covers,
// and why not where it does not (the simple backward runs everything else),
// and how wide its chains run.
// Host-only and header-only (unit-tested without a GPU).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/backward_args.h"

namespace flashqla::cuda {

constexpr int64_t kTensorCoreBackwardHeadDim = 128;

// The first rule of the tensor-core backward a call breaks, as a sentence
// naming the argument ("" when it covers the call).
inline std::string tensor_core_backward_refusal(const BackwardArgs& a) {
  const ForwardArgs& f = a.f;
  if (f.K != kTensorCoreBackwardHeadDim || f.V != kTensorCoreBackwardHeadDim) {
    return str("K = ", f.K, ", V = ", f.V, ": the tensor-core backward needs K = V = ", kTensorCoreBackwardHeadDim);
  }
  if (f.token_dtype != FLASHQLA_DTYPE_BFLOAT16) {
    return str("q, k, v: ", dtype_name(f.token_dtype), ": the tensor-core backward takes bfloat16");
  }
  if (a.do_dtype != FLASHQLA_DTYPE_BFLOAT16) {
    return str("d_o: ", dtype_name(a.do_dtype), ": the tensor-core backward takes bfloat16");
  }
  // Rows are read 16 bytes at a time: every row of q, k, v and dO 16-byte aligned.
  auto aligned = [](const void* p, int64_t sb, int64_t st, int64_t sh) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && sb % 8 == 0 && st % 8 == 0 && sh % 8 == 0;
  };
  const struct {
    const char* name;
    bool ok;
  } rows[] = {{"q", aligned(f.q, f.q_sb, f.q_st, f.q_sh)},
              {"k", aligned(f.k, f.k_sb, f.k_st, f.k_sh)},
              {"v", aligned(f.v, f.v_sb, f.v_st, f.v_sh)},
              {"d_o", aligned(a.d_o, a.do_sb, a.do_st, a.do_sh)}};
  for (const auto& r : rows) {
    if (!r.ok) {
      return str(r.name, ": rows must be 16-byte aligned (data pointer 16-byte aligned, strides multiples of 8 "
                         "elements) for the tensor-core backward");
    }
  }
  return "";
}

// The chain kernel's CTAs at `columns` value columns a CTA: both directions,
// 128 / columns V tiles a (sequence, value head).
inline int64_t chain_ctas(int64_t N, int64_t HV, int columns) { return 2 * (128 / columns) * N * HV; }

// Whether ctas CTAs, one an SM, leave at least half of the GPU's SMs idle.
inline bool leave_half_the_sms_idle(int64_t ctas, int sm_count) { return sm_count > 0 && 2 * ctas <= sm_count; }

// The chains' value columns a CTA: 32, unless the 32-column chains would fill
// fewer than half of the GPU's SMs (one CTA a SM: few (sequence, value head)
// pairs), then 16. forced (16 or 32) overrides; other values are ignored.
inline int chains_value_columns(int64_t N, int64_t HV, int sm_count, int64_t forced) {
  if (forced == 16 || forced == 32) return static_cast<int>(forced);
  return leave_half_the_sms_idle(chain_ctas(N, HV, 32), sm_count) ? 16 : 32;
}

// Whether the grads kernel runs beside the chains (on the SMs their CTAs leave
// idle, each chunk once both chains have stored its states) instead of after
// them: where the chains' CTAs, one an SM, leave at least half the SMs idle.
// forced 0 or 1 overrides; other values are ignored.
inline bool grads_beside_chains(int64_t N, int64_t HV, int chain_columns, int sm_count, int64_t forced) {
  if (forced == 0 || forced == 1) return forced == 1;
  return leave_half_the_sms_idle(chain_ctas(N, HV, chain_columns), sm_count);
}

}  // namespace flashqla::cuda
