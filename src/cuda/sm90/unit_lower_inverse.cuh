// The first level of (I + A)⁻¹ for a 64x64 strictly lower A, shared by the
// fused forward's producer and the backward's prep: one 16x16 diagonal block
// inverted by forward substitution in registers, a lane a column.
#pragma once

namespace flashqla::cuda {

// x = column `col` (0..15) of (I + A)⁻¹ for a 16x16 strictly lower block A,
// stored transposed: a_cols[m kLd + r] = A[r][m] (column m of A as a row, read
// as broadcast float4s: every lane of the warp reads the same one). Column by
// column of A: once x[m] is final it updates every later row at once, so the
// dependent chain is 15 FMAs deep.
template <int kLd>
__device__ __forceinline__ void unit_lower_inverse_column16(const float* a_cols, int col, float (&x)[16]) {
  static_assert(kLd % 4 == 0, "rows of float4s");
  // The identity column, built where it is used: as loop-invariant values
  // ptxas would keep them live across the caller's loops; the volatile move
  // pins them inside.
  float one;
  asm volatile("mov.b32 %0, 0x3f800000;\n" : "=f"(one));
#pragma unroll
  for (int r = 0; r < 16; ++r) x[r] = r == col ? one : 0.f;
#pragma unroll
  for (int m = 0; m < 15; ++m) {
#pragma unroll
    for (int q = (m + 1) / 4; q < 4; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(a_cols + m * kLd + 4 * q);
      const float cv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (4 * q + e > m) x[4 * q + e] -= cv[e] * x[m];
    }
  }
}

}  // namespace flashqla::cuda
