// One step of a sequence-piece scan (the forward's gdn_fwd_piece_scan_sm90.cu
// and the backward's gdn_bwd_tc_piece_scan_sm90.cu): a thread's 8 columns of one
// row of M X + local, from its row of M in registers and X's rows in shared memory.
#pragma once

namespace flashqla::cuda {

template <int kRows>
__device__ __forceinline__ void piece_scan_row_step(const float (&m)[kRows], const float (&x_s)[kRows][8],
                                                    float4& acc_lo, float4& acc_hi) {
#pragma unroll
  for (int k = 0; k < kRows; ++k) {
    const float4 x = reinterpret_cast<const float4*>(x_s[k])[0], y = reinterpret_cast<const float4*>(x_s[k])[1];
    acc_lo.x += m[k] * x.x, acc_lo.y += m[k] * x.y, acc_lo.z += m[k] * x.z, acc_lo.w += m[k] * x.w;
    acc_hi.x += m[k] * y.x, acc_hi.y += m[k] * y.y, acc_hi.z += m[k] * y.z, acc_hi.w += m[k] * y.w;
  }
}

}  // namespace flashqla::cuda
