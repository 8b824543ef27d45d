// Warp-level tensor-core building blocks: mma.sync m16n8k16 (bf16 / fp16 in,
// fp32 accumulate), ldmatrix fragment loads from padded row-major shared
// tiles, and fp32 -> 16-bit packing.
//
// Fragment layouts (PTX ISA, mma.m16n8k16; g = lane / 4, t = lane % 4):
//   A 16x16: a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B 16x8:  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C 16x8:  c0,c1 (g, 2t..2t+1)   c2,c3 (g+8, 2t..2t+1)
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace flashqla::cuda::mma {

template <typename T>
struct Mma;

template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  // Two packed elements times (lo, hi) (in fp32, rounded once).
  __device__ __forceinline__ static uint32_t scale_pair(uint32_t x, float lo, float hi) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
    return pack(f.x * lo, f.y * hi);
  }
  __device__ __forceinline__ static float2 unpack(uint32_t x) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
  }
};

template <>
struct Mma<__half> {
  __device__ __forceinline__ static void run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ __forceinline__ static uint32_t scale_pair(uint32_t x, float lo, float hi) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x));
    return pack(f.x * lo, f.y * hi);
  }
  __device__ __forceinline__ static float2 unpack(uint32_t x) {
    return __half22float2(*reinterpret_cast<const __half2*>(&x));
  }
};

// An fp32 value as a tf32 MMA operand, rounded to nearest (ties away from zero):
// the MMA ignores an operand's low 13 bits, so adding half of their range
// rounds the magnitude. The same bits as cvt.rna.tf32.f32 for finite values
// in one integer add (ptxas adds an infinity check to the cvt: two
// instructions); infinities and NaNs are not preserved.
__device__ __forceinline__ uint32_t to_tf32(float x) { return __float_as_uint(x) + 0x1000u; }

// One m16n8k8 tf32 MMA: c += A (16x8, fragment af) B (8x8, fragments b0, b1).
__device__ __forceinline__ void mma_tf32_m16n8k8(float (&c)[4], const uint32_t (&af)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(af[0]), "r"(af[1]), "r"(af[2]), "r"(af[3]), "r"(b0), "r"(b1));
}

// C (16x16, two n-tiles of C fragments) += A (16x16) B (16x16), fp32 operands
// read from shared tiles, A row-major and B transposed (bt[n * ldbt + k] =
// B[k][n]), multiplied in tf32 (m16n8k8):
//   A 16x8: a0 (g, t)  a1 (g+8, t)  a2 (g, t+4)  a3 (g+8, t+4);  B 8x8: b0 (k t, n g)  b1 (k t+4, n g)
// C: c[nt][e] at row g + 8 (e / 2), column 8 nt + 2 t + e % 2.
__device__ __forceinline__ void mma_tf32_16x16x16_bt(float (&c)[2][4], const float* a, int lda, const float* bt,
                                                     int ldbt, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int k0 = 0; k0 < 16; k0 += 8) {
    const uint32_t af[4] = {to_tf32(a[g * lda + k0 + t]), to_tf32(a[(g + 8) * lda + k0 + t]),
                            to_tf32(a[g * lda + k0 + t + 4]), to_tf32(a[(g + 8) * lda + k0 + t + 4])};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float* const col = bt + (8 * nt + g) * ldbt + k0;
      mma_tf32_m16n8k8(c[nt], af, to_tf32(col[t]), to_tf32(col[t + 4]));
    }
  }
}

// C (16x16) += A (16x16) B (16x16) with A an fp32 accumulator of this warp
// (mma_tf32_16x16x16_bt's C layout: a[nt][e] at row g + 8 (e / 2), column
// 8 nt + 2 t + e % 2) and B read row-major from shared memory. The sum over k
// takes each k8 block in the order 0, 2, 4, 6, 1, 3, 5, 7 (A's k slot t is
// column 2 t, slot t + 4 column 2 t + 1, and B's rows likewise), so that the
// accumulator's registers are A's fragment as they are: no shuffle, no round
// trip through shared memory.
__device__ __forceinline__ void mma_tf32_16x16x16_acc_a(float (&c)[2][4], const float (&a)[2][4], const float* b,
                                                        int ldb, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int kb = 0; kb < 2; ++kb) {
    const uint32_t af[4] = {to_tf32(a[kb][0]), to_tf32(a[kb][2]), to_tf32(a[kb][1]), to_tf32(a[kb][3])};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const float* const rows = b + (8 * kb + 2 * t) * ldb + 8 * nt + g;
      mma_tf32_m16n8k8(c[nt], af, to_tf32(rows[0]), to_tf32(rows[ldb]));
    }
  }
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Stores four 8x8 matrices transposed: register i holds this lane's pair of
// matrix i in the mma.sync C/A layout (row lane / 4, columns 2 (lane % 4)..+1);
// lanes 8 i..8 i + 7 give the addresses of matrix i's 8 stored rows (16 bytes
// each), i.e. of its columns.
__device__ __forceinline__ void stsm_x4_trans(void* p, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(smem_addr(p)), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// Shared-memory tiles of 16-bit elements, addressed by (row, column):
// - PaddedTile: row-major with a padded row stride (ld elements);
// - CoreTile: 8x8 core matrices (8 rows of 8 contiguous elements, 128 bytes),
//   the 8-column chunks of a row block 128 bytes apart, row blocks kCols * 16
//   bytes apart. ldmatrix reads a core matrix as 128 contiguous bytes (no bank
//   conflicts, no padding), and the same bytes are a wgmma operand in the
//   non-swizzled layout (rows = M/N and columns = K: K-major; the transpose:
//   MN-major).
template <typename T>
struct PaddedTile {
  T* base;
  int ld;
  __device__ __forceinline__ T* at(int r, int c) const { return base + r * ld + c; }
};

template <typename T, int kCols>
struct CoreTile {
  T* base;
  __device__ __forceinline__ T* at(int r, int c) const {
    return base + (r >> 3) * (kCols * 8) + (c >> 3) * 64 + (r & 7) * 8 + (c & 7);
  }
};

// - Swizzled128Tile: [kRows][64 n] as n column blocks of [kRows][64], each
//   row of a block 128 bytes whose 16-byte chunks are permuted by the row's
//   index mod 8 (chunk j at j ^ (r mod 8)): the TMA unit's 128-byte swizzle
//   (a tensor map's box row is one whole 128-byte line of global memory), and
//   wgmma's 128-byte swizzled layouts (K-major: 8-row groups 1024 bytes apart;
//   MN-major: the same with K = rows). The 8 rows of a core matrix hit
//   distinct banks. The base is 1024-byte aligned.
template <typename T, int kRows>
struct Swizzled128Tile {
  T* base;
  __device__ __forceinline__ T* at(int r, int c) const {
    return base + (c >> 6) * (kRows * 64) + r * 64 + ((((c >> 3) ^ r) & 7) << 3) + (c & 7);
  }
};

// A fragment of the 16x16 block at (r0, c0) of an [m][k] tile.
template <typename Tile>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const Tile& tile, int r0, int c0, int lane) {
  ldsm_x4(a, tile.at(r0 + (lane & 7) + (((lane >> 3) & 1) << 3), c0 + ((lane >> 4) << 3)));
}

// A fragment of A = Xᵀ for the 16x16 block at (m0, k0) of A, where X is a
// [k][m] tile.
template <typename Tile>
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const Tile& tile, int m0, int k0, int lane) {
  ldsm_x4_trans(a, tile.at(k0 + (lane & 7) + ((lane >> 4) << 3), m0 + (((lane >> 3) & 1) << 3)));
}

// B fragments of two adjacent n-tiles (n0 and n0 + 8) at reduction offset k0,
// from an [n][k] tile: b[0], b[1] for n0; b[2], b[3] for n0 + 8.
template <typename Tile>
__device__ __forceinline__ void load_b_nk(uint32_t (&b)[4], const Tile& tile, int n0, int k0, int lane) {
  ldsm_x4(b, tile.at(n0 + (lane & 7) + ((lane >> 4) << 3), k0 + (((lane >> 3) & 1) << 3)));
}

// The same two n-tiles from a [k][n] tile.
template <typename Tile>
__device__ __forceinline__ void load_b_kn(uint32_t (&b)[4], const Tile& tile, int k0, int n0, int lane) {
  ldsm_x4_trans(b, tile.at(k0 + (lane & 7) + (((lane >> 3) & 1) << 3), n0 + ((lane >> 4) << 3)));
}

}  // namespace flashqla::cuda::mma
