// What the tensor-core backward's three kernels share: chunk slots, bf16
// shared-memory tiles, row loads, a warp-level mma.sync GEMM over tiles and
// fragment stores. K = V = 128, bf16 operands, fp32 accumulation.
//
// Fragments (mma.m16n8k16, g = lane / 4, t = lane % 4): acc[mt][nt][e] is the
// element at row m0 + 16 mt + g + 8 (e / 2), column n0 + 8 nt + 2 t + e % 2.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "cuda/backward_args.h"
#include "cuda/sequence_piece_layout.h"
#include "cuda/sm90/device_common.cuh"
#include "cuda/sm90/warp_mma.cuh"

namespace flashqla::cuda::bwd {

using bf16 = __nv_bfloat16;
using Mma = mma::Mma<bf16>;
using Tile = mma::PaddedTile<bf16>;

constexpr int kChunk = 64;        // tokens a chunk
constexpr int kDim = 128;         // K = V
constexpr int kLdWide = kDim + 8;  // row stride of 128-column tiles (272 bytes: ldmatrix rows on distinct banks)
constexpr int kLdHalf = 64 + 8;    // of 64-column tiles (144 bytes)

// Chunk-state slot of chunk c of sequence n (the simple backward's rule):
// batch rows all have T tokens; packed sequences take floor(bos / 64) + n + c,
// which never collides and stays below floor(T / 64) + N.
__device__ __forceinline__ int64_t chunk_slot(int64_t n, int64_t c, int64_t bos, int64_t T, bool varlen) {
  return varlen ? bos / kChunk + n + c : n * ((T + kChunk - 1) / kChunk) + c;
}

// The chunk a slot holds: sequence, chunk index, batch row, first token, valid
// rows. valid == false for slots no chunk takes (gaps of packed sequences).
struct ChunkRef {
  int64_t n, c, row, t0;
  int L;
  bool valid;
};

__device__ __forceinline__ ChunkRef chunk_of_slot(const ForwardArgs& f, int64_t slot) {
  ChunkRef r{};
  if (f.cu_seqlens == nullptr) {
    const int64_t per = (f.T + kChunk - 1) / kChunk;
    r.n = per > 0 ? slot / per : 0;
    r.c = per > 0 ? slot % per : 0;
    r.row = r.n;
    r.t0 = r.c * kChunk;
    r.valid = r.n < f.N && r.t0 < f.T;
    r.L = r.valid ? int(min64(kChunk, f.T - r.t0)) : 0;
    return r;
  }
  // The last sequence whose first slot, floor(bos / 64) + n, is at most `slot`.
  int64_t lo = 0, hi = f.N - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    const int64_t bos = min64(max64(load_index(f.cu_seqlens, f.cu_seqlens_int64, mid), 0), f.T);
    if (bos / kChunk + mid <= slot) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const SequenceRange seq = sequence_range(f.cu_seqlens, f.cu_seqlens_int64, f.T, lo);
  r.n = lo;
  r.c = slot - (seq.bos / kChunk + lo);
  r.row = 0;
  r.t0 = seq.bos + r.c * kChunk;
  r.valid = r.c >= 0 && r.t0 < seq.eos;
  r.L = r.valid ? int(min64(kChunk, seq.eos - r.t0)) : 0;
  return r;
}

// The CTA's chunk (slot blockIdx.x) into `chunk`, a __shared__ ChunkRef that
// the kernel reads where it uses a field (uniform values that would otherwise
// hold registers through the whole kernel): false, for the whole CTA, where no
// chunk takes the slot. A CTA barrier when true.
__device__ __forceinline__ bool park_chunk(const ForwardArgs& f, ChunkRef& chunk) {
  const ChunkRef mine = chunk_of_slot(f, blockIdx.x);
  if (!mine.valid) return false;
  if (threadIdx.x == 0) chunk = mine;
  __syncthreads();
  return true;
}

// 16 bytes global -> shared without registers (cp.async); src_bytes 0 writes
// zeros (the source address is not read).
__device__ __forceinline__ void copy_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(mma::smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void wait_async_copies() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Closes this thread's group of copies issued since the last commit (possibly
// none), and waits until at most kPending of its groups are in flight.
__device__ __forceinline__ void commit_async_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wait_async_copies_but() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Starts copying rows [0, kRows) of kCols bf16 columns (row r at src + r *
// stride, 16-byte aligned) into a tile; rows >= L become zero. Complete after
// wait_async_copies() and a barrier.
template <int kThreads, int kCols, int kRows = kChunk>
__device__ __forceinline__ void load_rows(const Tile& dst, const bf16* src, int64_t stride, int L) {
  constexpr int kVecs = kCols / 8;
  for (int i = threadIdx.x; i < kRows * kVecs; i += kThreads) {
    const int r = i / kVecs, v = i % kVecs;
    copy_async_16(dst.at(r, v * 8), r < L ? src + r * stride + v * 8 : src, r < L);
  }
}

// The same copy for a loop over chunks by kThreads threads (thread: 0 ..
// kThreads − 1): the thread's share of the rows and its column are fixed at
// construction, so a chunk's copy costs a pointer step and a predicate per 16
// bytes. src points at the chunk's row 0, column 0.
template <int kThreads, int kCols>
struct RowCopy {
  static constexpr int kVecs = kCols / 8, kRowsAPass = kThreads / kVecs, kPasses = kChunk / kRowsAPass;
  static_assert(kThreads % kVecs == 0 && kChunk % kRowsAPass == 0, "whole passes over the chunk's rows");
  int r0, c;
  __device__ __forceinline__ explicit RowCopy(int thread) : r0(thread / kVecs), c(8 * (thread % kVecs)) {}
  template <typename Dst>  // any tile whose at(r, c) is 16-byte aligned for c % 8 == 0
  __device__ __forceinline__ void issue(const Dst& dst, const bf16* src, int64_t stride, int L) const {
    const bf16* p = src + r0 * stride + c;
#pragma unroll
    for (int j = 0; j < kPasses; ++j) {
      const int r = r0 + j * kRowsAPass;
      copy_async_16(dst.at(r, c), r < L ? p : src, r < L);
      p += kRowsAPass * stride;
    }
  }
};

// Two adjacent bf16 of global memory as floats, through the read-only path.
__device__ __forceinline__ float2 load_pair(const bf16* p) {
  return Mma::unpack(__ldg(reinterpret_cast<const unsigned int*>(p)));
}

// A chunk's gates for value head hv: thread t < 64 returns g of the chunk's
// token t (0 past its end) and writes the activated β to beta[t] (0 past the
// end); other threads return 0. γ is then chunk_scan of the returned value.
__device__ __forceinline__ float load_chunk_gates(const ForwardArgs& f, const ChunkRef& cr, int64_t hv, float* beta) {
  const int tid = threadIdx.x;
  float g = 0.f;
  if (tid < kChunk) {
    const bool in = tid < cr.L;
    const int64_t t = cr.t0 + tid;
    g = in ? load_float(f.g, f.g_dtype, cr.row * f.g_sb + t * f.g_st + hv) : 0.f;
    beta[tid] = in ? activate_beta(load_float(f.beta, f.beta_dtype, cr.row * f.beta_sb + t * f.beta_st + hv),
                                   f.beta_activation)
                   : 0.f;
  }
  return g;
}

// Inclusive prefix sum of x over the 64 threads 0..63 (two warps; part of a
// CTA-wide step: every thread of the CTA calls it). reverse: suffix sums.
__device__ __forceinline__ float chunk_scan(float x, float* carry, bool reverse) {
  const int tid = threadIdx.x, lane = tid % 32;
  if (tid < kChunk) {
    for (int off = 1; off < 32; off *= 2) {
      const float y = reverse ? __shfl_down_sync(0xffffffffu, x, off) : __shfl_up_sync(0xffffffffu, x, off);
      if (reverse ? lane + off < 32 : lane >= off) x += y;
    }
    // The warp that comes first in scan order hands its total to the other.
    if (tid == (reverse ? 32 : 31)) *carry = x;
  }
  __syncthreads();
  if (tid < kChunk && (reverse ? tid < 32 : tid >= 32)) x += *carry;
  __syncthreads();
  return x;
}

// Rows [0, 64) of a 128-column bf16 tile, in place: each row r < L times
// (l2norm ? rsqrt(Σx² + 1e-6) : 1) · scale(r), as the forward normalises. One
// warp a row, four columns a lane. factors (when given) receives each row's
// factor, rows r < L.
template <int kThreads, typename TileT, typename Scale>
__device__ __forceinline__ void scale_rows(const TileT& t, int L, bool l2norm, Scale scale, float* factors = nullptr) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < L; r += kThreads / 32) {
    uint2* p = reinterpret_cast<uint2*>(t.at(r, lane * 4));
    uint2 raw = *p;
    const float2 a = Mma::unpack(raw.x), b = Mma::unpack(raw.y);
    float s = scale(r);
    if (l2norm) {
      float ss = a.x * a.x + a.y * a.y + b.x * b.x + b.y * b.y;
      for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
      s *= rsqrtf(ss + 1e-6f);
    }
    raw.x = Mma::pack(a.x * s, a.y * s);
    raw.y = Mma::pack(b.x * s, b.y * s);
    *p = raw;
    if (factors != nullptr && lane == 0) factors[r] = s;
  }
}

// The A fragment of the 16x16 block at rows m0, reduction k0 of A = an [m][k]
// tile, or (kATrans) of A = Xᵀ for X stored as [k][m]; and the B fragments of
// the 16x16 block at reduction k0, columns n0 of B = a [k][n] tile, or (kBNK)
// of B stored as [n][k].
template <bool kATrans, typename TileA>
__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], const TileA& A, int m0, int k0, int lane) {
  if constexpr (kATrans) {
    mma::load_a_trans(a, A, m0, k0, lane);
  } else {
    mma::load_a(a, A, m0, k0, lane);
  }
}
template <bool kBNK, typename TileB>
__device__ __forceinline__ void load_b_fragment(uint32_t (&b)[4], const TileB& B, int k0, int n0, int lane) {
  if constexpr (kBNK) {
    mma::load_b_nk(b, B, n0, k0, lane);
  } else {
    mma::load_b_kn(b, B, k0, n0, lane);
  }
}

// acc[MT][NT] += A (rows m0 .., reduction k) · B (reduction k, columns n0 ..)
// over k in [0, kdim), 16 at a time. A is an [m][k] tile, or (kATrans) its
// transpose stored as [k][m]; B is a [k][n] tile, or (kBNK) stored as [n][k].
// kUnroll reduction steps are unrolled: two by default (fully unrolled, the
// fragment loads of every step are hoisted and a 64 x 128 warp tile runs out of
// registers); small tiles unroll fully, their addresses folded into the loads.
template <int MT, int NT, bool kATrans, bool kBNK, int kUnroll = 2, typename TileA = Tile, typename TileB = Tile>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const TileA& A, const TileB& B, int m0, int n0,
                                          int kdim) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs");
  const int lane = threadIdx.x % 32;
#pragma unroll kUnroll
  for (int k0 = 0; k0 < kdim; k0 += 16) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) load_a_fragment<kATrans>(a[mt], A, m0 + 16 * mt, k0, lane);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      load_b_fragment<kBNK>(b, B, k0, n0 + 16 * np, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Mma::run(acc[mt][2 * np], a[mt], b[0], b[1]);
        Mma::run(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// Two products of one B in one pass: acc1 += A1 · B and acc2 += A2 · B (as
// warp_gemm). B's fragments are loaded once, and the two accumulators' mma
// chains interleave (twice the independent mma a step for a latency-bound warp).
template <int NT, bool kATrans, bool kBNK, int kUnroll = 2>
__device__ __forceinline__ void warp_gemm_pair(float (&acc1)[1][NT][4], const Tile& A1, float (&acc2)[1][NT][4],
                                               const Tile& A2, const Tile& B, int m0, int n0, int kdim) {
  static_assert(NT % 2 == 0, "n-tiles come in pairs");
  const int lane = threadIdx.x % 32;
#pragma unroll kUnroll
  for (int k0 = 0; k0 < kdim; k0 += 16) {
    uint32_t a1[4], a2[4];
    load_a_fragment<kATrans>(a1, A1, m0, k0, lane);
    load_a_fragment<kATrans>(a2, A2, m0, k0, lane);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      load_b_fragment<kBNK>(b, B, k0, n0 + 16 * np, lane);
      Mma::run(acc1[0][2 * np], a1, b[0], b[1]);
      Mma::run(acc2[0][2 * np], a2, b[0], b[1]);
      Mma::run(acc1[0][2 * np + 1], a1, b[2], b[3]);
      Mma::run(acc2[0][2 * np + 1], a2, b[2], b[3]);
    }
  }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
}

// Visits every pair of adjacent elements of a fragment array with the pair's
// fragment indices (compile-time after unrolling):
// f(mt, nt, half, row, column, value of column, value of column + 1); the
// values are references, so f may change them.
template <int MT, int NT, typename F>
__device__ __forceinline__ void for_each_pair_at(float (&acc)[MT][NT][4], int m0, int n0, F f) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        f(mt, nt, half, m0 + 16 * mt + g + 8 * half, n0 + 8 * nt + 2 * t, acc[mt][nt][2 * half],
          acc[mt][nt][2 * half + 1]);
      }
}

// The same without the indices: f(row, column, value, value of column + 1).
template <int MT, int NT, typename F>
__device__ __forceinline__ void for_each_pair(float (&acc)[MT][NT][4], int m0, int n0, F f) {
  for_each_pair_at(acc, m0, n0, [&](int, int, int, int r, int c, float& x0, float& x1) { f(r, c, x0, x1); });
}

// Stores a pair as packed bf16 at tile (r, c).
template <typename TileT>
__device__ __forceinline__ void store_pair(const TileT& t, int r, int c, float x0, float x1) {
  *reinterpret_cast<uint32_t*>(t.at(r, c)) = Mma::pack(x0, x1);
}

// Stores a pair as packed bf16 to global memory.
__device__ __forceinline__ void store_pair(uint16_t* p, float x0, float x1) {
  *reinterpret_cast<uint32_t*>(p) = Mma::pack(x0, x1);
}

// Sums a per-row value over the 4 lanes of a quad (the lanes holding one
// fragment row).
// e^x on the SFU (ex2.approx, relative error about 2^-22): for the in-chunk
// decay factors e^{γ_r − γ_c}, which meet bf16 operands or fp32 sums of them.
__device__ __forceinline__ float fast_exp(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
  return y;
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// Token-major workspace rows: element (token, value head, column) of a
// [B T][HV][cols] array.
__device__ __forceinline__ int64_t token_index(int64_t row, int64_t t, int64_t T, int64_t hv, int64_t HV, int cols) {
  return ((row * T + t) * HV + hv) * cols;
}

// A piece state of BackwardArgs::piece_states: [128 keys][128 columns] fp32.
__device__ __forceinline__ float* piece_state(const BackwardArgs& a, int64_t n, int64_t j, int64_t hv, int kind) {
  return a.piece_states + (((n * a.max_pieces + j) * a.f.HV + hv) * kBwdPieceStates + kind) * int64_t(kDim * kDim);
}

}  // namespace flashqla::cuda::bwd
