// The tensor-core backward, step 3 of 3, on warpgroups: every gradient of one
// chunk from the states both chains stored, as gdn_bwd_tc_grads_sm90.cu
// computes them (the same algebra, the same CTA per (chunk, q/k head) running
// the group's value heads in turn), with every product one warpgroup's wgmma
// from shared memory and its accumulator in that warpgroup's registers.
//
// Three warpgroups, each running its own copy of the value-head loop (its
// accumulators live only there; registers 160 / 192 / 152). Per value head, V in
// two halves of 64 columns (S_h, dS'_h, V_h, dO_h of a half in one of two
// stages, the next half copied in while this one runs):
//   WG0  the gates; every copy of the loop; T0 += dO_h S_hᵀ (then dq += scale
//        e^γ T0; (Q̂ S)·dO = rows of T0 · Q̂), <S, dS'>; the tail's dq += (Γ ⊙ dP) K̂.
//   WG1  KS = K̂ S_h, ru = β (V − e^γ KS), Vd = M ru; dk += b Vd dS'_hᵀ,
//        dk += −e^γ β dR S_hᵀ, dA += dR Vdᵀ; the tail's dA ⊙ Γ and
//        dk += (Γ ⊙ dP)ᵀ Q̂ + sym(dA β Γ) K̂.
//   WG2  P (first half); X = K̂ dS'_h, dVd = b X + Pᵀ dO_h, dR = Mᵀ dVd (dv = β dR)
//        while WG1 forms Vd; the row sums; dP += dO_h Vdᵀ; the tail's Γ ⊙ dP,
//        sym(dA β Γ) (with K̂ K̂ᵀ formed again in its registers), dβ and dγ → dg.
// Each half starts at a CTA barrier; inside it WG1 and WG2 hand Vd and dR to
// each other (mbarriers: arrive / wait) and WG0 waits for no one. The l2norm backward of
// dq (WG0) and dk (WG1) runs on the accumulators, whose rows each warp holds
// whole. Beside the chains (BackwardArgs::chain_progress; where they leave
// half the SMs idle) each CTA takes its item from a ticket in readiness order
// and waits for both chains' counts before copying the item's states. The
// default step 3 (cuda_backend.cpp; FLASHQLA_BACKWARD_GRADS=warps
// selects the 16-warp mma.sync kernel of gdn_bwd_tc_grads_sm90.cu instead).
#include "cuda/sm90/gdn_bwd_tc_sm90.h"

#include <algorithm>

#include "cuda/sm90/gdn_bwd_tc/common.cuh"
#include "cuda/sm90/tma_load.cuh"
#include "cuda/sm90/warp_specialization.cuh"
#include "cuda/sm90/warpgroup_mma.cuh"

namespace flashqla::cuda {
namespace {

using namespace bwd;

constexpr int kThreads = 384;
constexpr int kHalf = 64;  // value columns a pass

using Wide = mma::CoreTile<bf16, kDim>;  // [64 tokens][128 keys]
using Sq = mma::CoreTile<bf16, 64>;      // [64][64]; and [128 keys][64 values] (state halves)
constexpr int kWideElems = kChunk * kDim, kSqElems = 64 * 64, kStateElems = kDim * kHalf;
constexpr int kLdF = kChunk + 1;  // row stride of fp32 [64][64] tiles

struct Stage {
  bf16 s[kStateElems], ds[kStateElems];  // [key][value] of one half
  bf16 v[kSqElems], d_o[kSqElems];       // [token][value] of one half
};

struct GradsSmem {
  bf16 q[kWideElems], k[kWideElems];  // Q̂, K̂
  Stage stage[2];
  bf16 m[kSqElems], p[kSqElems];
  // Per-half tiles; in the tail: dqk over ru, dasym over kst, the fp32 dA ⊙ Γ
  // over vdb, dvd, dr (tiles only wgmma reads, so no thread's load of a half
  // tile meets the tail's stores: vd, which role 2 loads, stays whole).
  bf16 ru[kSqElems], kst[kSqElems], vd[kSqElems], vdb[kSqElems], dvd[kSqElems], dr[kSqElems], dks[kSqElems];
  float qk[kChunk * kLdF];
  float gamma[kChunk], beta[kChunk], eg[kChunk], b[kChunk];
  float row_q[kChunk], udr[kChunk], ksdr[kChunk], xr[kChunk], pdp_row[kChunk], dar_row[kChunk];
  float pdp_col[4][kChunk], dar_col[4][kChunk];
  float red[4], carry;
  float rs_q[kChunk], rs_k[kChunk];  // the rows' l2norm factors rsqrt(Σx² + 1e-6) (use_qk_l2norm)
  // The value-head loop's hand-overs (mbarriers): every role's CTA barriers
  // (all threads), role 1's Vd to role 2 and role 2's dR to role 1.
  uint64_t all_roles, vd_ready, dr_ready;
};
static_assert(sizeof(GradsSmem) <= 227 * 1024, "fits one SM's shared memory");
extern __shared__ __align__(128) unsigned char grads_smem[];
static_assert(3 * sizeof(bf16) * kSqElems >= sizeof(float) * kChunk * kLdF, "vdb, dvd, dr hold the fp32 tile");

using wgmma::kK;
using wgmma::kMN;

// The descriptor of a core-matrix tile read from its first row and column as a
// wgmma operand of the given major-ness, and the step of 16 along the
// reduction: 2 core matrices (256 bytes) K-major, 16 rows (kCols · 32 bytes)
// MN-major. The tile's address is made opaque first, so that the descriptors
// are formed where a product runs instead of hoisted out of the loops and
// kept in registers.
template <cute::SM90::GMMA::Major kMajor, int kCols>
__device__ __forceinline__ uint64_t base_desc(const mma::CoreTile<bf16, kCols>& t) {
  bf16* b = t.base;
  asm volatile("" : "+l"(b));
  const mma::CoreTile<bf16, kCols> o{b};
  return kMajor == cute::SM90::GMMA::Major::K ? wgmma::kmajor_desc(o, 0) : wgmma::mnmajor_desc(o, 0);
}
template <cute::SM90::GMMA::Major kMajor, int kCols>
constexpr uint64_t kDescStep = kMajor == cute::SM90::GMMA::Major::K ? 256 / 16 : kCols * 32 / 16;

// d (+)= A B over K = 16 kSteps, a warpgroup's wgmma with both operands from
// shared memory (A [M][K] K-major or [K][M] MN-major; B [N][K] K-major or
// [K][N] MN-major). Committed, not waited.
template <int N, cute::SM90::GMMA::Major MA, cute::SM90::GMMA::Major MB, int kSteps, int kColsA, int kColsB>
__device__ __forceinline__ void wg_gemm(float (&d)[N / 2], const mma::CoreTile<bf16, kColsA>& A,
                                        const mma::CoreTile<bf16, kColsB>& B) {
  const uint64_t da = base_desc<MA>(A), db = base_desc<MB>(B);
  wgmma::fence(d);
#pragma unroll
  for (int s = 0; s < kSteps; ++s)
    wgmma::mma_ss<bf16, N, MA, MB>(da + s * kDescStep<MA, kColsA>, db + s * kDescStep<MB, kColsB>, d);
  wgmma::commit();
}

template <int R>
__device__ __forceinline__ void wait_all_wgmma(float (&d)[R]) {
  wgmma::wait<0>();
  wgmma::fence_operands(d);
}

template <int R>
__device__ __forceinline__ void zero_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) d[i] = 0.f;
}

// d = A B, formed and waited for (wg_gemm from a zeroed accumulator).
template <int N, cute::SM90::GMMA::Major MA, cute::SM90::GMMA::Major MB, int kSteps, int kColsA, int kColsB>
__device__ __forceinline__ void wg_product(float (&d)[N / 2], const mma::CoreTile<bf16, kColsA>& A,
                                           const mma::CoreTile<bf16, kColsB>& B) {
  zero_acc(d);
  wg_gemm<N, MA, MB, kSteps>(d, A, B);
  wait_all_wgmma(d);
}

// The thread's index read again where it is used (volatile: not merged with an
// earlier read), so that ptxas recomputes the indices and addresses derived from
// it in each phase instead of keeping them live, or spilled, across the loops.
__device__ __forceinline__ int tid_again() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}

// Visits every pair of adjacent accumulator elements of a warpgroup's m64nN
// wgmma: f(j, half, row, column, x0, x1), rows 16 warp + g + 8 half, columns
// 8 j + 2 t (+1); j and half compile-time after unrolling.
template <int N, typename F>
__device__ __forceinline__ void for_each_acc(float (&d)[N / 2], F f) {
  const int t = tid_again(), lane = t % 32, w = (t / 32) % 4;
  const int r0 = 16 * w + lane / 4, c0 = 2 * (lane % 4);
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int half = 0; half < 2; ++half) f(j, half, r0 + 8 * half, 8 * j + c0, d[4 * j + 2 * half], d[4 * j + 2 * half + 1]);
}

// A [64] array's values at the thread's two accumulator rows (16 w + g and + 8),
// read once before a loop over the accumulator whose stores to shared memory
// would otherwise make the compiler read them again for every pair.
struct RowVals {
  float v[2];
};
__device__ __forceinline__ RowVals rows_of(const float (&arr)[kChunk]) {
  const int t = tid_again(), lane = t % 32, w = (t / 32) % 4, r0 = 16 * w + lane / 4;
  return {{arr[r0], arr[r0 + 8]}};
}

__device__ __forceinline__ float2 load_bf16_pair(const bf16* p) { return Mma::unpack(*reinterpret_cast<const uint32_t*>(p)); }

template <typename TileT>
__device__ __forceinline__ void store_bf16_pair(const TileT& t, int r, int c, float x0, float x1) {
  *reinterpret_cast<uint32_t*>(t.at(r, c)) = Mma::pack(x0, x1);
}

// Writes rows r < L of a warpgroup's m64nN accumulator, times scale(r), to
// out[base + r · stride + column] (elements). bf16 pairs (bf16_pairs) take a
// loop of their own, one row pointer for each of the thread's two rows, so
// that the usual path is a few instructions a pair and the dtype dispatch of
// store_float stays out of its way.
template <int N, typename Scale>
__device__ __forceinline__ void store_acc_rows(const float (&d)[N / 2], void* out, flashqla_dtype_t dtype, int64_t base,
                                               int64_t stride, bool pairs, int L, Scale scale) {
  const int t = tid_again(), lane = t % 32, w = (t / 32) % 4;
  const int r0 = 16 * w + lane / 4, c0 = 2 * (lane % 4);
  if (pairs) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int r = r0 + 8 * hh;
      if (r < L) {
        bf16* const row = static_cast<bf16*>(out) + base + r * stride + c0;
        const float sc = scale(r);
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
          *reinterpret_cast<uint32_t*>(row + 8 * j) = Mma::pack(sc * d[4 * j + 2 * hh], sc * d[4 * j + 2 * hh + 1]);
      }
    }
  } else {
#pragma unroll 1
    for (int hh = 0; hh < 2; ++hh) {
      const int r = r0 + 8 * hh;
      if (r >= L) continue;
      const int64_t o = base + r * stride + c0;
      const float sc = scale(r);
#pragma unroll
      for (int j = 0; j < N / 8; ++j) {
        store_float(out, dtype, o + 8 * j, sc * (hh == 0 ? d[4 * j] : d[4 * j + 2]));
        store_float(out, dtype, o + 8 * j + 1, sc * (hh == 0 ? d[4 * j + 1] : d[4 * j + 3]));
      }
    }
  }
}

// Starts copying rows [0, kRows) of kCols bf16 columns (row r at src + r
// stride) into a core-matrix tile, rows >= L as zeros; by threads 0 ..
// kBy − 1, eight consecutive threads filling one core matrix (128 contiguous
// bytes). A rolled loop: the copies run in every role's loop, whose code must
// stay small enough for the instruction cache.
template <int kBy, int kCols, int kRows>
__device__ __forceinline__ void load_core_rows(const mma::CoreTile<bf16, kCols>& dst, const bf16* src, int64_t stride,
                                               int L) {
  constexpr int kVecs = kCols / 8;
#pragma unroll 1
  for (int i = tid_again() % kBy; i < kRows * kVecs; i += kBy) {
    const int r = (i / (8 * kVecs)) * 8 + i % 8, v = (i / 8) % kVecs;
    copy_async_16(dst.at(r, v * 8), r < L ? src + r * stride + v * 8 : src, r < L);
  }
}

// Starts copying value columns [cv0, cv0 + 64) of a stored state (a [128][128]
// mma::CoreTile, BackwardArgs::states) into a [128][64] core-matrix tile, by
// threads kBy consecutive ones: each 8-row block is one contiguous kilobyte on
// both sides.
template <int kBy>
__device__ __forceinline__ void load_state_half(const mma::CoreTile<bf16, 64>& dst, const bf16* state, int cv0) {
#pragma unroll 1
  for (int i = tid_again() % kBy; i < kDim * 64 / 8; i += kBy) {
    const int b = i / 64, j = i % 64;
    copy_async_16(dst.base + b * 512 + j * 8, state + b * (kDim * 8) + (cv0 / 8) * 64 + j * 8, true);
  }
}

// The rows of two [64][128] core-matrix tiles (q and k) scaled in place to unit
// l2 norm (times rsqrt(Σx² + 1e-6), as the forward normalises; the factors
// into rs_a and rs_b for the l2norm backward), by threads
// kBy consecutive ones (tid mod kBy). A warp takes a block of eight rows: lane l holds row l % 8 of
// core matrices 4 j + l / 8 (16 bytes each, the warp's 512 bytes contiguous, so
// no bank conflicts), and a row's sum is over the four lanes l % 8 + 8 i.
template <int kBy>
__device__ __forceinline__ void normalize_core_rows(const Wide& a, const Wide& b, float (&rs_a)[kChunk],
                                                    float (&rs_b)[kChunk]) {
  constexpr int kBlocks = kChunk / 8;
  const int t = tid_again() % kBy, lane = t % 32;
#pragma unroll 1
  for (int blk = t / 32; blk < 2 * kBlocks; blk += kBy / 32) {
    bf16* const row = (blk < kBlocks ? a.base : b.base) + (blk % kBlocks) * (kDim * 8) + (lane / 8) * 64 + (lane % 8) * 8;
    uint4 v[kDim / 32];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kDim / 32; ++j) {
      v[j] = *reinterpret_cast<const uint4*>(row + j * 4 * 64);
      const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 xv = Mma::unpack(w[e]);
        ss += xv.x * xv.x + xv.y * xv.y;
      }
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 8);
    ss += __shfl_xor_sync(0xffffffffu, ss, 16);
    const float rs = rsqrtf(ss + 1e-6f);
    if (lane < 8) (blk < kBlocks ? rs_a : rs_b)[(blk % kBlocks) * 8 + lane] = rs;
#pragma unroll
    for (int j = 0; j < kDim / 32; ++j) {
      uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 xv = Mma::unpack(w[e]);
        w[e] = Mma::pack(rs * xv.x, rs * xv.y);
      }
      *reinterpret_cast<uint4*>(row + j * 4 * 64) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// The copies of this thread complete, their data visible to every thread and
// to wgmma after the barrier that follows.
__device__ __forceinline__ void land_copies() {
  wait_async_copies();
  wgmma::fence_shared_for_async();
}

// A barrier of the whole CTA that the warpgroups reach from their own code
// (each role's loop is its own instructions): GradsSmem::all_roles, every
// thread arriving and waiting. A value head's loop passes it six times (two
// halves' B0, then T0 to T3), so each use's parity is fixed: B0 the half's,
// T0 and T2 0, T1 and T3 1.
__device__ __forceinline__ void sync_all(uint64_t* bar, uint32_t parity) { ws::mbarrier_arrive_and_wait(bar, parity); }

// What every role reads: the chunk, the arguments and the shared memory.
struct Ctx {
  GradsSmem& s;
  const BackwardArgs& a;
  const ChunkRef& cr;
  int64_t h, slot, hv0, hv_end;
  int L;
};

template <int kBy>
__device__ __forceinline__ void issue_m(const Ctx& x, int64_t hv) {
  const ForwardArgs& f = x.a.f;
  const int64_t tok64 = token_index(x.cr.row, x.cr.t0, f.T, hv, f.HV, kChunk);
  load_core_rows<kBy, 64, kChunk>(Sq{x.s.m}, reinterpret_cast<const bf16*>(x.a.minv) + tok64, f.HV * kChunk, x.L);
}

template <int kBy>
__device__ __forceinline__ void issue_half(const Ctx& x, int64_t hv, int half) {
  const ForwardArgs& f = x.a.f;
  const BackwardArgs& a = x.a;
  const ChunkRef& cr = x.cr;
  Stage& st = x.s.stage[half];
  const int cv0 = kHalf * half;
  const int64_t so = (x.slot * f.HV + hv) * kDim * kDim;
  load_state_half<kBy>(Sq{st.s}, reinterpret_cast<const bf16*>(a.states) + so, cv0);
  load_state_half<kBy>(Sq{st.ds}, reinterpret_cast<const bf16*>(a.dstates) + so, cv0);
  load_core_rows<kBy, 64, kChunk>(Sq{st.v}, static_cast<const bf16*>(f.v) + cr.row * f.v_sb + cr.t0 * f.v_st + hv * f.v_sh + cv0,
                             f.v_st, x.L);
  load_core_rows<kBy, 64, kChunk>(
      Sq{st.d_o}, static_cast<const bf16*>(a.d_o) + cr.row * a.do_sb + cr.t0 * a.do_st + hv * a.do_sh + cv0, a.do_st, x.L);
}

// A value head's gates by the first warp: γ its in-chunk cumsum, β activated,
// e^γ, b = e^{γ_L − γ}; role 2's row sums zeroed.
__device__ __forceinline__ void head_gates(const Ctx& x, int64_t hv) {
  GradsSmem& s = x.s;
  const ForwardArgs& f = x.a.f;
  const int tid = threadIdx.x, L = x.L;
  if (tid < 32) {
    const int lane = tid;
    float g[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = 2 * lane + e;
      const bool in = t < L;
      const int64_t tok = x.cr.t0 + t;
      g[e] = in ? load_float(f.g, f.g_dtype, x.cr.row * f.g_sb + tok * f.g_st + hv) : 0.f;
      s.beta[t] = in ? activate_beta(load_float(f.beta, f.beta_dtype, x.cr.row * f.beta_sb + tok * f.beta_st + hv),
                                     f.beta_activation)
                     : 0.f;
    }
    g[1] += g[0];
    float run = g[1];  // inclusive prefix over the lanes of their pair sums
    for (int off = 1; off < 32; off *= 2) {
      const float y = __shfl_up_sync(0xffffffffu, run, off);
      if (lane >= off) run += y;
    }
    const float before = run - g[1];
    const float gam[2] = {before + g[0], before + g[1]};
    const float last = __shfl_sync(0xffffffffu, (L - 1) % 2 == 0 ? gam[0] : gam[1], (L - 1) / 2);
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = 2 * lane + e;
      s.gamma[t] = gam[e];
      s.eg[t] = expf(gam[e]);
      s.b[t] = expf(last - gam[e]);
      s.xr[t] = s.udr[t] = s.ksdr[t] = 0.f;  // role 2's row sums over the halves
    }
  }
}

// P = scale Γ ⊙ Q̂K̂ᵀ (lower, rows < L) by one warpgroup, for its own wgmma
// after the warpgroup's barrier.
__device__ __forceinline__ void form_p(const Ctx& x) {
  GradsSmem& s = x.s;
  const ForwardArgs& f = x.a.f;
  const int L = x.L;
  const Sq p{s.p};
#pragma unroll 2
  for (int i = tid_again() % 128; i < kChunk * kChunk / 2; i += 128) {
    const int r = i / (kChunk / 2), c = 2 * (i % (kChunk / 2));
    const bool row_in = r < L;
    store_bf16_pair(p, r, c, row_in && c <= r ? f.scale * fast_exp(s.gamma[r] - s.gamma[c]) * s.qk[r * kLdF + c] : 0.f,
                    row_in && c + 1 <= r ? f.scale * fast_exp(s.gamma[r] - s.gamma[c + 1]) * s.qk[r * kLdF + c + 1]
                                         : 0.f);
  }
  wgmma::fence_shared_for_async();
}

// Column c's sum over a warp's 16 rows of an m64n64 accumulator's column
// partials (part[i]: column 8 (i / 2) + 2 t + i % 2; summed over the lanes of
// one t) into col[c].
__device__ __forceinline__ void column_sums(float (&part)[16], float (&col)[kChunk], int lane) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float v = part[i];
    for (int off = 4; off < 32; off *= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane < 4) col[8 * (i / 2) + 2 * lane + i % 2] = v;
  }
}

// Adds a warp's two per-row sums (rows 16 w + g and + 8; quad-summed) to a
// [64] array: one lane a row, so the halves' sums add in a fixed order.
__device__ __forceinline__ void add_rows(float (&arr)[kChunk], const float (&v)[2], int w, int lane) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float x = quad_sum(v[hh]);
    if (lane % 4 == 0) arr[16 * w + lane / 4 + 8 * hh] += x;
  }
}

// Named barriers (0 is the CTA's): inside role 1 and inside role 2 (each its
// four warps at one instruction), and role 1 with role 2 (the two sides at
// their own instructions: barrier.sync).
using Role2Barrier = ws::NamedBarrier<1, 1, 128>;
using Role1Barrier = ws::NamedBarrier<2, 1, 128>;
static_assert(ws::named_barriers_disjoint<Role2Barrier, Role1Barrier>(), "named barrier ids overlap");
// Role 1 and role 2 hand over on mbarriers (GradsSmem::vd_ready: vd, vdb
// written by role 1, read next by role 2; dr_ready: dr, dks written by role 2,
// read next by role 1), one use a half: parity = the half (the next half's
// arrivals come after B0, which the waiting side reaches only after its wait).

// The tiles a phase works on, formed where it starts from an opaque offset
// into the shared memory (smem_again): ptxas would otherwise keep every tile's
// address, and the descriptors made from them, in registers across the loops.
// The offset, not the address, is made opaque, so that the accesses stay
// shared-memory instructions (LDS, STS) rather than generic ones.
__device__ __forceinline__ GradsSmem& smem_again() {
  uint32_t off = 0;
  asm volatile("" : "+r"(off));
  return *reinterpret_cast<GradsSmem*>(grads_smem + off);
}
#define PHASE_TILES                                                                                                   \
  GradsSmem& s = smem_again();                                                                                     \
  const int tid = tid_again(), lt = tid % 128, lane = tid % 32, w = lt / 32;                                          \
  (void)lt, (void)lane, (void)w;                                                                                      \
  const Wide q{s.q}, k{s.k};                                                                                          \
  const Sq m{s.m}, p{s.p}, ru{s.ru}, kst{s.kst}, vd{s.vd}, vdb{s.vdb}, dvd{s.dvd}, dr{s.dr}, dks{s.dks};              \
  const Sq dqk{s.ru}, dasym{s.kst};                                                                                   \
  float* const scratch = reinterpret_cast<float*>(s.vdb); /* [64][kLdF]: dA ⊙ Γ in the tail */                        \
  (void)q, (void)k, (void)m, (void)p, (void)ru, (void)kst, (void)vd, (void)vdb, (void)dvd, (void)dr, (void)dks,       \
      (void)dqk, (void)dasym, (void)scratch;
#define HALF_TILES                                                                                                    \
  PHASE_TILES                                                                                                         \
  Stage& st = s.stage[half];                                                                                          \
  const Sq S{st.s}, dS{st.ds}, V{st.v}, dO{st.d_o};                                                                   \
  (void)S, (void)dS, (void)V, (void)dO;

// One warpgroup's part of the value-head loop (kRole 0, 1, 2 as the header
// says); every role passes the same CTA barriers in the same order. Returns
// dq (role 0) or dk (role 1) in acc. A half starts at a CTA barrier (its stage
// in place, the tiles of the half before free); inside it the roles wait only
// for what they read (role 1 for its own ru and role 2's dr and dks, role 2
// for role 1's vd and its own P and dVd, role 0 for nothing).
// Role 0, which waits for no one, also issues every copy of the loop (the
// next half's stage, the next value head's M) and forms the gates, so that
// the other roles' loops hold no copy code.
template <int kRole>
__device__ __forceinline__ void run_role(const Ctx& x, float (&acc_main)[64]) {
  const BackwardArgs& a = x.a;
  const ForwardArgs& f = a.f;
  const ChunkRef& cr = x.cr;
  const int L = x.L;

#pragma unroll 1
  for (int64_t hv = x.hv0; hv < x.hv_end; ++hv) {
    if constexpr (kRole == 0) head_gates(x, hv);
    float t0[64];   // role 0: Σ_h dO_h S_hᵀ
    float dpa[32];  // role 2: dP
    float daa[32];  // role 1: dA (+dR Vdᵀ)
    float kk[32];   // role 2: K̂K̂ᵀ, issued in tail 1, read in tail 2
    float sds = 0.f;                                                           // role 0: <S, dS'> share
    if constexpr (kRole == 0) zero_acc(t0);
    if constexpr (kRole == 1) zero_acc(daa);
    if constexpr (kRole == 2) zero_acc(dpa);

#pragma unroll 1
    for (int half = 0; half < 2; ++half) {
      if constexpr (kRole == 0) land_copies();
      sync_all(&smem_again().all_roles, half);  // B0: the half's stage, M and the gates in place
      // The next half's operands into the other stage (its last reader finished before B0).
      if constexpr (kRole == 0) {
        const bool next_head = half == 1;
        if (!next_head || hv + 1 < x.hv_end) issue_half<128>(x, hv + next_head, next_head ? 0 : 1);
      }

      // Phase A: role 0 T0 += dO S_hᵀ, <S, dS'>; role 1 KS → kst, ru; role 2 X = K̂ dS'_h.
      float xa[32];
      if constexpr (kRole == 0) { HALF_TILES
        wg_gemm<128, kK, kK, kHalf / 16>(t0, dO,
                                         S);
        for (int i = lt; i < kStateElems / 2; i += 128) {
          const float2 xs = load_bf16_pair(st.s + 2 * i), ys = load_bf16_pair(st.ds + 2 * i);
          sds += xs.x * ys.x + xs.y * ys.y;
        }
        wait_all_wgmma(t0);
      } else if constexpr (kRole == 1) { HALF_TILES
        wg_product<64, kK, kMN, kDim / 16>(xa, k, S);
        const RowVals beta = rows_of(s.beta), eg = rows_of(s.eg);
        for_each_acc<64>(xa, [&](int, int hh, int r, int c, float& x0, float& x1) {
          const float2 v = load_bf16_pair(V.at(r, c));
          store_bf16_pair(kst, r, c, x0, x1);
          store_bf16_pair(ru, r, c, beta.v[hh] * (v.x - eg.v[hh] * x0), beta.v[hh] * (v.y - eg.v[hh] * x1));
        });
        wgmma::fence_shared_for_async();
      } else { HALF_TILES
        zero_acc(xa);
        wg_gemm<64, kK, kMN, kDim / 16>(xa, k,
                                        dS);
        if (half == 0) {  // the value head's P while the product runs
          form_p(x);
          wgmma::fence_shared_for_async();
        }
        wait_all_wgmma(xa);
        if (half == 0) Role2Barrier::sync();  // P, for the product below
      }

      // Phase B: role 1 Vd = M ru → vd, vdb (role 2 waits for them only where
      // it reads kst and vd); role 2 dVd = b K̂dS' + Pᵀ dO → dvd (b K̂dS' kept
      // for x_r).
      float bx[32];  // role 2: b K̂dS'
      if constexpr (kRole == 1) { HALF_TILES
        Role1Barrier::sync();  // ru
        wg_product<64, kK, kMN, kChunk / 16>(xa, m, ru);
        const RowVals b = rows_of(s.b);
        for_each_acc<64>(xa, [&](int, int hh, int r, int c, float& x0, float& x1) {
          store_bf16_pair(vd, r, c, x0, x1);
          store_bf16_pair(vdb, r, c, b.v[hh] * x0, b.v[hh] * x1);
        });
        wgmma::fence_shared_for_async();
        ws::mbarrier_arrive(&smem_again().vd_ready);
      } else if constexpr (kRole == 2) { HALF_TILES
        const RowVals b = rows_of(s.b);
        for_each_acc<64>(xa, [&](int j, int hh, int, int, float& x0, float& x1) {
          x0 *= b.v[hh];
          x1 *= b.v[hh];
          bx[4 * j + 2 * hh] = x0;
          bx[4 * j + 2 * hh + 1] = x1;
        });
        wg_gemm<64, kMN, kMN, kChunk / 16>(xa, p,
                                           dO);
        wait_all_wgmma(xa);
        for_each_acc<64>(xa, [&](int, int, int r, int c, float& x0, float& x1) { store_bf16_pair(dvd, r, c, x0, x1); });
        wgmma::fence_shared_for_async();
        Role2Barrier::sync();  // dvd
      }

      // Phase C: role 1 dk += b Vd dS'_hᵀ; role 2 dR = Mᵀ dVd → dv, dr, dks;
      // dP += dO Vdᵀ issued, U · dR and KS · dR by rows, then x_r += (b K̂dS')_r · Vd_r.
      if constexpr (kRole == 1) { HALF_TILES
        wg_gemm<128, kK, kK, kHalf / 16>(acc_main, vdb,
                                         dS);  // waited in phase D
      } else if constexpr (kRole == 2) { HALF_TILES
        const bool dv_pairs = bf16_pairs(a.dv, a.dv_dtype, a.dv_sb, a.dv_st, a.dv_sh);
        wg_product<64, kMN, kMN, kChunk / 16>(xa, m, dvd);
        const RowVals beta = rows_of(s.beta), eg = rows_of(s.eg);
        for_each_acc<64>(xa, [&](int, int hh, int r, int c, float& d0, float& d1) {
          store_bf16_pair(dr, r, c, d0, d1);
          const float e = -eg.v[hh] * beta.v[hh];
          store_bf16_pair(dks, r, c, e * d0, e * d1);
        });
        wgmma::fence_shared_for_async();
        ws::mbarrier_arrive(&smem_again().dr_ready);  // role 1's phase D waits for nothing else
        const int cv0 = kHalf * half;
        store_acc_rows<64>(xa, a.dv, a.dv_dtype, cr.row * a.dv_sb + cr.t0 * a.dv_st + hv * a.dv_sh + cv0, a.dv_st,
                           dv_pairs, L, [&](int r) { return s.beta[r]; });
        tma::wait(&smem_again().vd_ready, half);  // kst, vd
        wg_gemm<64, kK, kK, kHalf / 16>(dpa, dO, vd);  // dP += dO Vdᵀ under the row sums; waited in phase D
        float row_u[2] = {0.f, 0.f}, row_k[2] = {0.f, 0.f};
        for_each_acc<64>(xa, [&](int, int hh, int r, int c, float& d0, float& d1) {
          const float2 kv = load_bf16_pair(kst.at(r, c)), v = load_bf16_pair(V.at(r, c));
          row_u[hh] += (v.x - eg.v[hh] * kv.x) * d0 + (v.y - eg.v[hh] * kv.y) * d1;
          row_k[hh] += kv.x * d0 + kv.y * d1;
        });
        add_rows(s.udr, row_u, w, lane);
        add_rows(s.ksdr, row_k, w, lane);
        float row_x[2] = {0.f, 0.f};
        for_each_acc<64>(bx, [&](int, int hh, int r, int c, float& x0, float& x1) {
          const float2 v = load_bf16_pair(vd.at(r, c));
          row_x[hh] += x0 * v.x + x1 * v.y;
        });
        add_rows(s.xr, row_x, w, lane);
      }

      // Phase D: role 1 dk += dks S_hᵀ, dA += dR Vdᵀ; role 2 waits for dP += dO Vdᵀ.
      if constexpr (kRole == 1) { HALF_TILES
        tma::wait(&smem_again().dr_ready, half);  // dr, dks
        wg_gemm<128, kK, kK, kHalf / 16>(acc_main, dks, S);
        wg_gemm<64, kK, kK, kHalf / 16>(daa, dr, vd);
        wgmma::wait<0>();
        wgmma::fence_operands(acc_main);
        wgmma::fence_operands(daa);
      } else if constexpr (kRole == 2) {
        wait_all_wgmma(dpa);
      }
    }
    sync_all(&smem_again().all_roles, 0);  // T0: the halves' tiles free (dqk, dasym and the fp32 tile alias them), M free
    if constexpr (kRole == 0) {
      if (hv + 1 < x.hv_end) issue_m<128>(x, hv + 1);
    }

    // Tail 1 (the next value head's M copied meanwhile): role 0 (Q̂S)·dO rows and
    // dq += scale e^γ T0; role 1 dA ⊙ Γ (strictly lower) → scratch; role 2 Γ ⊙ dP →
    // dqk, P ⊙ dP by rows and columns, K̂K̂ᵀ (kept for tail 2).
    if constexpr (kRole == 0) { PHASE_TILES
      float rq[2] = {0.f, 0.f};
      for_each_acc<128>(t0, [&](int, int hh, int r, int c, float& x0, float& x1) {
        const float2 qv = load_bf16_pair(q.at(r, c));
        rq[hh] += x0 * qv.x + x1 * qv.y;
        const float e = f.scale * s.eg[r];
        x0 *= e;
        x1 *= e;
      });
#pragma unroll
      for (int i = 0; i < 64; ++i) acc_main[i] += t0[i];
      const int r0 = 16 * w + lane / 4;
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const float v = quad_sum(rq[hh]);
        if (lane % 4 == 0) s.row_q[r0 + 8 * hh] = v;
      }
      float y = sds;
      for (int off = 16; off > 0; off /= 2) y += __shfl_xor_sync(0xffffffffu, y, off);
      if (lane == 0) s.red[w] = y;
    } else if constexpr (kRole == 1) { PHASE_TILES
      for_each_acc<64>(daa, [&](int, int, int r, int c, float& x0, float& x1) {
        const bool row_in = r < L;
        scratch[r * kLdF + c] = row_in && c < r ? -fast_exp(s.gamma[r] - s.gamma[c]) * x0 : 0.f;
        scratch[r * kLdF + c + 1] = row_in && c + 1 < r ? -fast_exp(s.gamma[r] - s.gamma[c + 1]) * x1 : 0.f;
      });
    } else if constexpr (kRole == 2) { PHASE_TILES
      zero_acc(kk);
      wg_gemm<64, kK, kK, kDim / 16>(kk, k, k);  // waited in tail 2
      const int r0 = 16 * w + lane / 4;
      {  // Γ ⊙ dP → dqk; P ⊙ dP (strictly lower) by rows and columns
        float pr[2] = {0.f, 0.f}, pc[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) pc[i] = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = r0 + 8 * (e / 2), c = 8 * j + 2 * (lane % 4) + e % 2;
            const float G = r < L && c <= r ? fast_exp(s.gamma[r] - s.gamma[c]) : 0.f;
            const float dqkv = f.scale * G * dpa[4 * j + e];
            const float pdp = c < r ? dqkv * s.qk[r * kLdF + c] : 0.f;
            pr[e / 2] += pdp;
            pc[2 * j + e % 2] += pdp;
            dpa[4 * j + e] = dqkv;
          }
        for_each_acc<64>(dpa, [&](int, int, int r, int c, float& x0, float& x1) { store_bf16_pair(dqk, r, c, x0, x1); });
        column_sums(pc, s.pdp_col[w], lane);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float v = quad_sum(pr[hh]);
          if (lane % 4 == 0) s.pdp_row[r0 + 8 * hh] = v;
        }
      }
      wgmma::fence_shared_for_async();
    }
    sync_all(&smem_again().all_roles, 1);  // T1: dqk, scratch, the row and column sums

    // Tail 2: role 0 dq += dqk K̂; role 1 dk += dqkᵀ Q̂; role 2 dasym = β_i dAΓ_ij +
    // β_j dAΓ_ji, then (its first warp) dβ, dγ and dg.
    if constexpr (kRole == 0) { PHASE_TILES
      wg_gemm<128, kK, kMN, kChunk / 16>(acc_main, dqk,
                                         k);
      wait_all_wgmma(acc_main);
    } else if constexpr (kRole == 1) { PHASE_TILES
      wg_gemm<128, kMN, kMN, kChunk / 16>(acc_main, dqk,
                                          q);
      wait_all_wgmma(acc_main);
    } else { PHASE_TILES
      {  // dA ⊙ Γ ⊙ K̂K̂ᵀ by rows, and times β by columns
        wait_all_wgmma(kk);
        const int r0 = 16 * w + lane / 4;
        float ar[2] = {0.f, 0.f}, ac[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) ac[i] = 0.f;
        for_each_acc<64>(kk, [&](int j, int hh, int r, int c, float& k0, float& k1) {
          const float d0 = scratch[r * kLdF + c] * k0, d1 = scratch[r * kLdF + c + 1] * k1;
          ar[hh] += d0 + d1;
          ac[2 * j] += s.beta[r] * d0;
          ac[2 * j + 1] += s.beta[r] * d1;
        });
        column_sums(ac, s.dar_col[w], lane);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const float v = quad_sum(ar[hh]);
          if (lane % 4 == 0) s.dar_row[r0 + 8 * hh] = v;
        }
      }
      for (int i = lt; i < kChunk * kChunk / 2; i += 128) {
        const int r = i / (kChunk / 2), c = 2 * (i % (kChunk / 2));
        store_bf16_pair(dasym, r, c, s.beta[r] * scratch[r * kLdF + c] + s.beta[c] * scratch[c * kLdF + r],
                        s.beta[r] * scratch[r * kLdF + c + 1] + s.beta[c + 1] * scratch[(c + 1) * kLdF + r]);
      }
      wgmma::fence_shared_for_async();
      Role2Barrier::sync();  // the column sums of the warpgroup's four warps
      if (lt < 32) {  // two rows a lane
        float dgam[2], xsum = 0.f;
        const float sds_total = s.red[0] + s.red[1] + s.red[2] + s.red[3];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = 2 * lane + e;
          float pcol = 0.f, acol = 0.f;
#pragma unroll
          for (int ww = 0; ww < 4; ++ww) {
            pcol += s.pdp_col[ww][t];
            acol += s.dar_col[ww][t];
          }
          const float xt = t < L - 1 ? s.xr[t] : 0.f;
          xsum += xt;
          dgam[e] = s.pdp_row[t] - pcol + s.beta[t] * s.dar_row[t] - acol + f.scale * s.eg[t] * s.row_q[t] -
                    s.eg[t] * s.beta[t] * s.ksdr[t] - xt;
          float db = s.dar_row[t] + s.udr[t];
          if (t < L) {
            const int64_t tok = cr.t0 + t;
            if (f.beta_activation != FLASHQLA_BETA_IDENTITY) {
              const float raw = load_float(f.beta, f.beta_dtype, cr.row * f.beta_sb + tok * f.beta_st + hv);
              db *= activate_beta_grad(raw, f.beta_activation);
            }
            store_float(a.dbeta, a.dbeta_dtype, cr.row * a.dbeta_sb + tok * a.dbeta_st + hv, db);
          }
        }
        for (int off = 16; off > 0; off /= 2) xsum += __shfl_xor_sync(0xffffffffu, xsum, off);
        // dγ_last gets e^{γ_L} <S, dS'> and Σ x; then dg_t = Σ_{i ≥ t} dγ_i.
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (2 * lane + e == L - 1) dgam[e] += s.eg[L - 1] * sds_total + xsum;
        const float pair = dgam[0] + dgam[1];
        float run = pair;  // inclusive suffix over the lanes of their pair sums
        for (int off = 1; off < 32; off *= 2) {
          const float y = __shfl_down_sync(0xffffffffu, run, off);
          if (lane + off < 32) run += y;
        }
        const float above = run - pair;
        const float dgv[2] = {pair + above, dgam[1] + above};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = 2 * lane + e;
          if (t < L) store_float(a.dg, a.dg_dtype, cr.row * a.dg_sb + (cr.t0 + t) * a.dg_st + hv, dgv[e]);
        }
      }
    }
    sync_all(&smem_again().all_roles, 0);  // T2: dasym

    // Tail 3: role 1 dk += dasym K̂.
    if constexpr (kRole == 1) { PHASE_TILES
      wg_gemm<128, kK, kMN, kChunk / 16>(acc_main, dasym,
                                         k);
      wait_all_wgmma(acc_main);
    }
    sync_all(&smem_again().all_roles, 1);  // T3: the tail's tiles free for the next value head
  }
}

#undef HALF_TILES
#undef PHASE_TILES

// The l2norm backward of dq (role 0) or dk (role 1) on the accumulator, from
// the normalised rows y (the tile the products read) and the rows' factors r:
// dx = r (dy − y (y · dy)), as FLA's l2norm backward takes it; then its rows
// < L out.
__device__ __forceinline__ void finish_rows(const Ctx& x, float (&d)[64], const Wide& y, const float (&rs_rows)[kChunk],
                                            void* out, int64_t ob, int64_t ost, int64_t osh, flashqla_dtype_t odt) {
  const ForwardArgs& f = x.a.f;
  const bool pairs = bf16_pairs(out, odt, ob, ost, osh);
  if (f.use_qk_l2norm) {
    float dot[2] = {0.f, 0.f};
    for_each_acc<128>(d, [&](int, int hh, int r, int c, float& x0, float& x1) {
      const float2 yv = load_bf16_pair(y.at(r, c));
      dot[hh] += yv.x * x0 + yv.y * x1;
    });
    const RowVals rs = rows_of(rs_rows);
    float ydy[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) ydy[hh] = quad_sum(dot[hh]);
    for_each_acc<128>(d, [&](int, int hh, int r, int c, float& x0, float& x1) {
      const float2 yv = load_bf16_pair(y.at(r, c));
      x0 = rs.v[hh] * (x0 - yv.x * ydy[hh]);
      x1 = rs.v[hh] * (x1 - yv.y * ydy[hh]);
    });
  }
  store_acc_rows<128>(d, out, odt, x.cr.row * ob + x.cr.t0 * ost + x.h * osh, ost, pairs, x.L, [](int) { return 1.f; });
}

// Registers a thread of each role (the launch gives 168 to each of the three
// warpgroups; the roles' accumulators are 128, 128 and 96 floats a thread).
constexpr int kLaunchRegisters = ws::launch_registers<kThreads>();
constexpr int kRoleRegisters[3] = {160, 192, 152};
static_assert(kRoleRegisters[0] + kRoleRegisters[1] + kRoleRegisters[2] <= 3 * kLaunchRegisters,
              "the roles' registers fit the register file");

template <int kRole>
__device__ __forceinline__ void role_main(const Ctx& x) {
  if constexpr (kRoleRegisters[kRole] != kLaunchRegisters)
    ws::set_max_registers<kRoleRegisters[kRole], kLaunchRegisters>();
  float acc[64];  // dq (role 0), dk (role 1)
  zero_acc(acc);
  run_role<kRole>(x, acc);
  const BackwardArgs& a = x.a;
  if constexpr (kRole == 0) finish_rows(x, acc, Wide{x.s.q}, x.s.rs_q, a.dq, a.dq_sb, a.dq_st, a.dq_sh, a.dq_dtype);
  if constexpr (kRole == 1) finish_rows(x, acc, Wide{x.s.k}, x.s.rs_k, a.dk, a.dk_sb, a.dk_st, a.dk_sh, a.dk_dtype);
}

// Beside the chains: the CTA's item, taken from the ticket all CTAs share
// (one thread), in the order both chains finish the chunks' states: ticket
// t = h + H (n + N r) is q/k head h of the chunk of rank r in sequence n,
// rank 0 its middle chunk, then outward alternately (chunk c's states come
// after max(c + 1, n_chunks − c) steps of the chains); ranks past a
// sequence's chunks are skipped. item: its chunk slot and q/k head;
// chunk.valid false: no item left. The grid
// has chunk_slots · H CTAs, at least one per item.
__device__ __forceinline__ void take_item_beside(const BackwardArgs& a, ChunkRef& chunk, int64_t (&item)[2]) {
  const ForwardArgs& f = a.f;
  unsigned* const ticket = a.chain_progress + 2 * f.N * f.HV * 8;
  const int64_t tickets = a.chunk_slots * f.H * f.N;
  chunk.valid = false;
#pragma unroll 1
  for (;;) {
    const int64_t t = atomicAdd(ticket, 1u);
    if (t >= tickets) return;
    const int64_t n = (t / f.H) % f.N, rank = t / (f.H * f.N);
    const SequenceRange seq = sequence_range(f.cu_seqlens, f.cu_seqlens_int64, f.T, n);
    const int64_t n_chunks = (seq.eos - seq.bos + kChunk - 1) / kChunk;
    if (rank >= n_chunks) continue;
    const int64_t mid = n_chunks / 2, c = rank % 2 == 1 ? mid - (rank + 1) / 2 : mid + rank / 2;
    // The sequence's first slot: bos / 64 + n packed (chunk_of_slot), n · chunks a sequence otherwise.
    const int64_t first = f.cu_seqlens != nullptr ? seq.bos / kChunk + n : n * ((f.T + kChunk - 1) / kChunk);
    chunk = chunk_of_slot(f, first + c);
    item[0] = first + c;
    item[1] = t % f.H;
    return;
  }
}

// Beside the chains: until both have stored the chunk's states for every value
// head of the group (each V tile's CTA past it: S entering the chunk, step
// c + 1 of the state chain; dS leaving it, step n_chunks − c of the gradient
// chain). By role 0 before it copies the first stage.
__device__ __forceinline__ void wait_for_chains(const Ctx& x) {
  const BackwardArgs& a = x.a;
  const ForwardArgs& f = a.f;
  const SequenceRange seq = sequence_range(f.cu_seqlens, f.cu_seqlens_int64, f.T, x.cr.n);
  const unsigned grad_steps = static_cast<unsigned>((seq.eos - seq.bos + kChunk - 1) / kChunk - x.cr.c);
  const int64_t per_head = a.chain_tiles, state_dir = f.N * f.HV * per_head;
  const unsigned* const grad = a.chain_progress + (x.cr.n * f.HV + x.hv0) * per_head;
  const int64_t counts = (x.hv_end - x.hv0) * per_head;
#pragma unroll 1
  for (int64_t t = 0; t < counts; ++t) {
    wait_until_at_least(grad + state_dir + t, static_cast<unsigned>(x.cr.c + 1));
    wait_until_at_least(grad + t, grad_steps);
  }
}

template <bool kBeside>
__global__ void __launch_bounds__(kThreads, 1) gdn_bwd_tc_grads_wg_kernel(const BackwardArgs a) {
  GradsSmem& s = *reinterpret_cast<GradsSmem*>(grads_smem);
  const ForwardArgs& f = a.f;
  if (threadIdx.x == 0) {  // (the barriers below order it before any use)
    tma::barrier_init(&s.all_roles, kThreads);
    tma::barrier_init(&s.vd_ready, 128);
    tma::barrier_init(&s.dr_ready, 128);
    tma::fence_barrier_init();
  }
  __shared__ ChunkRef chunk;
  int64_t h, slot;
  if constexpr (kBeside) {
    __shared__ int64_t item[2];  // slot, q/k head
    if (threadIdx.x == 0) take_item_beside(a, chunk, item);
    __syncthreads();
    if (!chunk.valid) {
      if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) wait_for_prerequisite_grids();  // see the kernel's end
      return;
    }
    slot = item[0];
    h = item[1];
  } else {
    if (!park_chunk(f, chunk)) return;
    slot = blockIdx.x;
    h = blockIdx.y;
  }
  const ChunkRef& cr = chunk;
  const Ctx x{s, a, cr, h, slot, h * f.group, (h + 1) * f.group, cr.L};
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);
  const Wide q{s.q}, k{s.k};

  load_core_rows<kThreads, kDim, kChunk>(q, static_cast<const bf16*>(f.q) + cr.row * f.q_sb + cr.t0 * f.q_st + h * f.q_sh, f.q_st,
                               x.L);
  load_core_rows<kThreads, kDim, kChunk>(k, static_cast<const bf16*>(f.k) + cr.row * f.k_sb + cr.t0 * f.k_st + h * f.k_sh, f.k_st,
                               x.L);
  commit_async_copies();
  // The first value head's M and stage by role 0 (whose land_copies before the
  // loop's first barrier waits for them), landing while q and k are normalised
  // and Q̂K̂ᵀ is formed.
  if (wg == 0) {
    issue_m<128>(x, x.hv0);
    if constexpr (kBeside) wait_for_chains(x);
    issue_half<128>(x, x.hv0, 0);
    commit_async_copies();
    wait_async_copies_but<1>();
  } else {
    wait_async_copies();
  }
  wgmma::fence_shared_for_async();
  __syncthreads();
  if (f.use_qk_l2norm) {
    normalize_core_rows<kThreads>(q, k, s.rs_q, s.rs_k);
    wgmma::fence_shared_for_async();
    __syncthreads();
  }
  if (wg == 2) {  // Q̂ K̂ᵀ in fp32, shared by the group's value heads
    float acc[32];
    wg_product<64, kK, kK, kDim / 16>(acc, q, k);
    for_each_acc<64>(acc, [&](int, int, int r, int c, float& x0, float& x1) {
      s.qk[r * kLdF + c] = x0;
      s.qk[r * kLdF + c + 1] = x1;
    });
  }
  __syncthreads();
  if (wg == 0) {
    role_main<0>(x);
  } else if (wg == 1) {
    role_main<1>(x);
  } else {
    role_main<2>(x);
  }
  // Beside the chains, the grid is not done before them (their last stores,
  // dh0): its last CTA waits for them before it exits, whatever it ran. (Every
  // CTA waiting held each SM until the chains' end, one item an SM beside them.)
  if constexpr (kBeside) {
    if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) wait_for_prerequisite_grids();
  }
}

}  // namespace

cudaError_t launch_gdn_bwd_tc_grads_warpgroups(const BackwardArgs& args, cudaStream_t stream) {
  const size_t smem = sizeof(GradsSmem);
  const bool beside = args.chain_progress != nullptr;
  auto* const kernel = beside ? gdn_bwd_tc_grads_wg_kernel<true> : gdn_bwd_tc_grads_wg_kernel<false>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  if (args.chunk_slots == 0 || args.f.H == 0) return cudaSuccess;
  if (!beside) {
    kernel<<<dim3(static_cast<unsigned>(args.chunk_slots), static_cast<unsigned>(args.f.H)), kThreads, smem, stream>>>(
        args);
    return cudaGetLastError();
  }
  // Beside the chains: their programmatic dependent (it starts once every chain
  // CTA has, so no wait of its CTAs holds a chain CTA back), a CTA per item.
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(args.chunk_slots * args.f.H));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute programmatic{};
  programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  programmatic.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &programmatic;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args);
}

}  // namespace flashqla::cuda
