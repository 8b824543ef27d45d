// The tensor-core backward, step 3 of 3, on 16 warps with mma.sync: the kernel
// the warpgroup one (gdn_bwd_tc_grads_wg_sm90.cu) replaced, run where
// FLASHQLA_BACKWARD_GRADS=warps. Every gradient of one chunk from the
// states both chains stored, all chunks at once. One CTA of 16 warps (4 row
// blocks x 4 column parts of every product) per (chunk, q/k head)
// runs the head's value heads in turn, so dq and dk are summed over the GQA
// group in registers (no partials, no atomics) and go through the l2norm
// backward in place. Per value head, V in two halves of 64 columns (S, dS'
// and the V-wide tiles of one half in shared memory):
//   KS = K̂ S, U = V − e^γ KS, Vd = M diag(β) U
//   dVd = diag(b) K̂ dS' + scale Pᵀ dO,  dR = Mᵀ dVd,  dv = β dR,  dKS = −e^γ β dR
//   dP += dOs Vdᵀ, dA −= dR Vdᵀ, dq += diag(e^γ) dOs Sᵀ, dk += dKS Sᵀ + diag(b) Vd dS'ᵀ
// then dq += (Γ ⊙ dP) K̂ and dk += (Γ ⊙ dP)ᵀ Q̂ + sym(dA β Γ) K̂,
// with dβ and dγ (then dg, its reverse in-chunk cumsum) from row and column
// sums, as the CPU backend's chunked backward (src/cpu/chunked_reference.cpp).
#include "cuda/sm90/gdn_bwd_tc_sm90.h"

#include "cuda/sm90/gdn_bwd_tc/common.cuh"

namespace flashqla::cuda {
namespace {

using namespace bwd;

constexpr int kThreads = 512;
constexpr int kParts = kThreads / 128;   // column parts of the warp tiles (4 row blocks of 16 each)
constexpr int kHalf = 64;                // value columns a pass
constexpr int kNT64 = 64 / kParts / 8;   // n-tiles a warp of a 64-column product
constexpr int kNT128 = 128 / kParts / 8; // of a 128-column product

struct GradsSmem {
  bf16 q[kChunk * kLdWide], k[kChunk * kLdWide];
  bf16 s[kDim * kLdHalf], ds[kDim * kLdHalf];  // [key][value] of one half
  // After the halves, vt holds Γ ⊙ dP and ru the symmetrised dA β Γ.
  bf16 vt[kChunk * kLdHalf], dos[kChunk * kLdHalf], dosd[kChunk * kLdHalf], kst[kChunk * kLdHalf], ru[kChunk * kLdHalf], vd[kChunk * kLdHalf], vdb[kChunk * kLdHalf],
      dr[kChunk * kLdHalf], dks[kChunk * kLdHalf];
  bf16 minv[kChunk * kLdHalf], p[kChunk * kLdHalf];
  float qk[kChunk][kChunk + 1], kk[kChunk][kChunk + 1], scratch[kChunk][kChunk + 1];
  float gamma[kChunk], beta[kChunk], eg[kChunk], b[kChunk], dgam[kChunk], dbet[kChunk];
  // Per-row partial sums of the warps that share a row block (index warp / 4).
  float row_udr[kParts][kChunk], row_ksdr[kParts][kChunk], row_x[kParts][kChunk], row_q[kParts][kChunk];
  float row_sq[kParts][kChunk], row_dot[kParts][kChunk];
  float red[kThreads / 32], carry;
};

// Adds a quad-summed per-row value to the warp's slot of a [kParts][64] array
// (lane t == 0 of each quad writes; the two rows of a fragment).
__device__ __forceinline__ void add_row(float (&arr)[kParts][kChunk], int part, int r, float v) {
  v = quad_sum(v);
  if (threadIdx.x % 4 == 0) arr[part][r] += v;
}

// Row r's sum over the column parts, in a fixed order.
__device__ __forceinline__ float row_total(const float (&arr)[kParts][kChunk], int r) {
  float x = arr[0][r];
#pragma unroll
  for (int i = 1; i < kParts; ++i) x += arr[i][r];
  return x;
}

// x, which ptxas may not assume equal to any value it derived from x before: the
// thread's index made opaque once a phase, so the addresses derived from it are
// recomputed in the phase instead of hoisted out of the loops and kept (at 128
// registers a thread, kept ones were spilled).
__device__ __forceinline__ int opaque(int x) {
  asm volatile("" : "+r"(x));
  return x;
}

__global__ void __launch_bounds__(kThreads, 1) gdn_bwd_tc_grads_kernel(const BackwardArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  GradsSmem& s = *reinterpret_cast<GradsSmem*>(smem_raw);
  const ForwardArgs& f = a.f;
  __shared__ ChunkRef chunk;
  if (!park_chunk(f, chunk)) return;
  const ChunkRef& cr = chunk;
  const int64_t h = blockIdx.y, slot = blockIdx.x;
  const int L = cr.L, tid = threadIdx.x, warp = tid / 32, part = warp / 4;
  const Tile q{s.q, kLdWide}, k{s.k, kLdWide}, st{s.s, kLdHalf}, vt{s.vt, kLdHalf}, dst{s.ds, kLdHalf}, dos{s.dos, kLdHalf},
      ru{s.ru, kLdHalf}, vd{s.vd, kLdHalf}, vdb{s.vdb, kLdHalf}, dr{s.dr, kLdHalf}, dks{s.dks, kLdHalf},
      minv{s.minv, kLdHalf}, p{s.p, kLdHalf}, dosd{s.dosd, kLdHalf}, kst{s.kst, kLdHalf}, dqk{s.vt, kLdHalf}, dasym{s.ru, kLdHalf};
  // Warp tiles: 64 x 64 products at rows m0, columns n0; 64 x 128 at rows m0, columns n1
  // (recomputed in each value head's pass and in the l2norm's, so ptxas keeps none of
  // them, nor what it derives from them, across the loop).
  const int m0 = 16 * (warp % 4), n0 = (64 / kParts) * part;

  load_rows<kThreads, kDim>(q, static_cast<const bf16*>(f.q) + cr.row * f.q_sb + cr.t0 * f.q_st + h * f.q_sh, f.q_st, L);
  load_rows<kThreads, kDim>(k, static_cast<const bf16*>(f.k) + cr.row * f.k_sb + cr.t0 * f.k_st + h * f.k_sh, f.k_st, L);
  wait_async_copies();
  __syncthreads();
  scale_rows<kThreads>(q, L, f.use_qk_l2norm, [](int) { return 1.f; });
  scale_rows<kThreads>(k, L, f.use_qk_l2norm, [](int) { return 1.f; });
  __syncthreads();
  {  // Q̂ K̂ᵀ and K̂ K̂ᵀ, shared by the group's value heads
    float acc[1][kNT64][4];
    zero(acc);
    warp_gemm<1, kNT64, false, true>(acc, q, k, m0, n0, kDim);
    for_each_pair(acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
      s.qk[r][c] = x0;
      s.qk[r][c + 1] = x1;
    });
    zero(acc);
    warp_gemm<1, kNT64, false, true>(acc, k, k, m0, n0, kDim);
    for_each_pair(acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
      s.kk[r][c] = x0;
      s.kk[r][c + 1] = x1;
    });
  }

  // A value head's M, and a half's S, dS' and dO: issued for the next value head
  // as soon as the last half is done with them, so they load during the
  // group's per-value-head tail.
  auto issue_minv = [&](int64_t hv) {
    const int64_t tok64 = token_index(cr.row, cr.t0, f.T, hv, f.HV, kChunk);
    load_rows<kThreads, kChunk>(minv, reinterpret_cast<const bf16*>(a.minv) + tok64, f.HV * kChunk, L);
  };
  auto issue_half = [&](int64_t hv, int cv0) {
    // The stored states are [128][128] mma::CoreTiles (BackwardArgs::states):
    // row r, columns 8 v .. 8 v + 7 at (r / 8) · 1024 + v · 64 + (r % 8) · 8.
    const bf16* const gs = reinterpret_cast<const bf16*>(a.states) + (slot * f.HV + hv) * kDim * kDim;
    const bf16* const gds = reinterpret_cast<const bf16*>(a.dstates) + (slot * f.HV + hv) * kDim * kDim;
    for (int i = threadIdx.x; i < kDim * kHalf / 8; i += kThreads) {
      const int r = i / (kHalf / 8), v = i % (kHalf / 8);
      const int64_t off = (r / 8) * (kDim * 8) + (cv0 / 8 + v) * 64 + (r % 8) * 8;
      copy_async_16(st.at(r, v * 8), gs + off, true);
      copy_async_16(dst.at(r, v * 8), gds + off, true);
    }
    load_rows<kThreads, kHalf>(
        dos, static_cast<const bf16*>(a.d_o) + cr.row * a.do_sb + cr.t0 * a.do_st + hv * a.do_sh + cv0, a.do_st, L);
  };
  float dq[1][kNT128][4], dk[1][kNT128][4];
  zero(dq);
  zero(dk);
  issue_minv(h * f.group);
  for (int64_t hv = h * f.group; hv < (h + 1) * f.group; ++hv) {
    // This thread's index, opaque to ptxas once a value head: the elementwise
    // passes' addresses are recomputed here instead of hoisted out of this loop
    // (at 128 registers the hoisted ones were spilled).
    const int tid = opaque(static_cast<int>(threadIdx.x));
    const bool dv_pairs = bf16_pairs(a.dv, a.dv_dtype, a.dv_sb, a.dv_st, a.dv_sh);
    float g = load_chunk_gates(f, cr, hv, s.beta);
#pragma unroll 1
    for (int i = opaque(static_cast<int>(threadIdx.x)); i < kParts * kChunk; i += kThreads) {
      (&s.row_udr[0][0])[i] = 0.f;
      (&s.row_ksdr[0][0])[i] = 0.f;
      (&s.row_x[0][0])[i] = 0.f;
      (&s.row_q[0][0])[i] = 0.f;
    }
    g = chunk_scan(g, &s.carry, false);
    if (tid < kChunk) s.gamma[tid] = g;
    __syncthreads();
    if (tid < kChunk) {
      s.eg[tid] = expf(s.gamma[tid]);
      s.b[tid] = expf(s.gamma[L - 1] - s.gamma[tid]);
    }
    // P = Γ ⊙ Q̂ K̂ᵀ (lower, diagonal included, rows < L), bf16
#pragma unroll 1
    for (int i = opaque(static_cast<int>(threadIdx.x)); i < kChunk * kChunk / 2; i += kThreads) {
      const int r = i / (kChunk / 2), c = 2 * (i % (kChunk / 2));
      const bool row_in = r < L;
      store_pair(p, r, c, row_in && c <= r ? f.scale * fast_exp(s.gamma[r] - s.gamma[c]) * s.qk[r][c] : 0.f,
                 row_in && c + 1 <= r ? f.scale * fast_exp(s.gamma[r] - s.gamma[c + 1]) * s.qk[r][c + 1] : 0.f);
    }

    float dP[1][kNT64][4], dA[1][kNT64][4];
    zero(dP);
    zero(dA);
    float sds = 0.f;  // this thread's share of <S, dS'>
    for (int half = 0; half < 2; ++half) {
      const int tid = opaque(static_cast<int>(threadIdx.x));  // (as at the value head's start)
      const int warp = tid / 32, part = warp / 4;
      const int m0 = 16 * (warp % 4), n0 = (64 / kParts) * part, n1 = (128 / kParts) * part;
      const int cv0 = kHalf * half;
      if (half > 0 || hv == h * f.group) issue_half(hv, cv0);  // else issued during the last value head's tail
      load_rows<kThreads, kHalf>(
          vt, static_cast<const bf16*>(f.v) + cr.row * f.v_sb + cr.t0 * f.v_st + hv * f.v_sh + cv0, f.v_st, L);
      wait_async_copies();
      __syncthreads();
#pragma unroll 1
      for (int i = opaque(static_cast<int>(threadIdx.x)); i < kChunk * kHalf / 2; i += kThreads) {
        const int r = i / (kHalf / 2), c = 2 * (i % (kHalf / 2));
        const float2 d = Mma::unpack(*reinterpret_cast<const uint32_t*>(dos.at(r, c)));
        const float ds = f.scale * s.eg[r];
        store_pair(dosd, r, c, d.x * ds, d.y * ds);
      }
#pragma unroll 1
      for (int i = opaque(static_cast<int>(threadIdx.x)); i < kDim * kHalf / 2; i += kThreads) {
        const int r = i / (kHalf / 2), c = 2 * (i % (kHalf / 2));
        const float2 x = Mma::unpack(*reinterpret_cast<const uint32_t*>(st.at(r, c)));
        const float2 y = Mma::unpack(*reinterpret_cast<const uint32_t*>(dst.at(r, c)));
        sds += x.x * y.x + x.y * y.y;
      }
      // KS = K̂ S and Q̂ S in one pass; U = V − e^γ KS; ru = β U
      float ks[1][kNT64][4], qs[1][kNT64][4];
      zero(ks);
      zero(qs);
      warp_gemm_pair<kNT64, false, false>(ks, k, qs, q, st, m0, n0, kDim);
      {
        const int lane = tid % 32, g8 = lane / 4, t4 = lane % 4;
#pragma unroll
        for (int nt = 0; nt < kNT64; ++nt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = m0 + g8 + 8 * hh, c = n0 + 8 * nt + 2 * t4;
            const float2 v = Mma::unpack(*reinterpret_cast<const uint32_t*>(vt.at(r, c)));
            store_pair(ru, r, c, s.beta[r] * (v.x - s.eg[r] * ks[0][nt][2 * hh]),
                       s.beta[r] * (v.y - s.eg[r] * ks[0][nt][2 * hh + 1]));
            store_pair(kst, r, c, ks[0][nt][2 * hh], ks[0][nt][2 * hh + 1]);
          }
      }
      {  // (Q̂ S)_r · dOs_r toward dγ_r (times e^γ_r later)
        float lo = 0.f, hi = 0.f;
        for_each_pair_at(qs, m0, n0, [&](int, int, int hh, int r, int c, float& x0, float& x1) {
          const float2 d = Mma::unpack(*reinterpret_cast<const uint32_t*>(dos.at(r, c)));
          const float x = x0 * d.x + x1 * d.y;
          if (hh == 0) {
            lo += x;
          } else {
            hi += x;
          }
        });
        const int g8 = (tid % 32) / 4;
        add_row(s.row_q, part, m0 + g8, lo);
        add_row(s.row_q, part, m0 + g8 + 8, hi);
      }
      __syncthreads();
      {  // Vd = M ru
        float acc[1][kNT64][4];
        zero(acc);
        warp_gemm<1, kNT64, false, false>(acc, minv, ru, m0, n0, kChunk);
        for_each_pair(acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
          store_pair(vd, r, c, x0, x1);
          store_pair(vdb, r, c, s.b[r] * x0, s.b[r] * x1);
        });
      }
      __syncthreads();
      {  // dVd = b K̂ dS' + Pᵀ dOs (into ru); x_r = (b K̂ dS')_r · Vd_r
        float acc[1][kNT64][4];
        zero(acc);
        warp_gemm<1, kNT64, false, false>(acc, k, dst, m0, n0, kDim);
        float x_lo = 0.f, x_hi = 0.f;
        for_each_pair_at(acc, m0, n0, [&](int, int, int hh, int r, int c, float& x0, float& x1) {
          x0 *= s.b[r];
          x1 *= s.b[r];
          const float2 v = Mma::unpack(*reinterpret_cast<const uint32_t*>(vd.at(r, c)));
          const float x = x0 * v.x + x1 * v.y;
          if (hh == 0) {
            x_lo += x;
          } else {
            x_hi += x;
          }
        });
        const int g = (tid % 32) / 4;
        add_row(s.row_x, part, m0 + g, x_lo);
        add_row(s.row_x, part, m0 + g + 8, x_hi);
        warp_gemm<1, kNT64, true, false>(acc, p, dos, m0, n0, kChunk);
        for_each_pair(acc, m0, n0, [&](int r, int c, float& x0, float& x1) { store_pair(ru, r, c, x0, x1); });
      }
      __syncthreads();
      {  // dR = Mᵀ dVd; dv = β dR; dks = −e^γ β dR; U · dR and KS · dR by rows
        float acc[1][kNT64][4];
        zero(acc);
        warp_gemm<1, kNT64, true, false>(acc, minv, ru, m0, n0, kChunk);
        const int lane = tid % 32, g = lane / 4, t4 = lane % 4;
        float udr[2] = {0.f, 0.f}, ksdr[2] = {0.f, 0.f};
#pragma unroll
        for (int nt = 0; nt < kNT64; ++nt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            const int r = m0 + g + 8 * hh, c = n0 + 8 * nt + 2 * t4;
            const float d0 = acc[0][nt][2 * hh], d1 = acc[0][nt][2 * hh + 1];
            const float2 kv = Mma::unpack(*reinterpret_cast<const uint32_t*>(kst.at(r, c)));
            const float k0 = kv.x, k1 = kv.y;
            const float2 v = Mma::unpack(*reinterpret_cast<const uint32_t*>(vt.at(r, c)));
            udr[hh] += (v.x - s.eg[r] * k0) * d0 + (v.y - s.eg[r] * k1) * d1;
            ksdr[hh] += k0 * d0 + k1 * d1;
            store_pair(dr, r, c, d0, d1);
            store_pair(dks, r, c, -s.eg[r] * s.beta[r] * d0, -s.eg[r] * s.beta[r] * d1);
            if (r < L) {
              const int64_t o = cr.row * a.dv_sb + (cr.t0 + r) * a.dv_st + hv * a.dv_sh + cv0 + c;
              store_float_pair(a.dv, a.dv_dtype, o, s.beta[r] * d0, s.beta[r] * d1, dv_pairs);
            }
          }
        add_row(s.row_udr, part, m0 + g, udr[0]);
        add_row(s.row_udr, part, m0 + g + 8, udr[1]);
        add_row(s.row_ksdr, part, m0 + g, ksdr[0]);
        add_row(s.row_ksdr, part, m0 + g + 8, ksdr[1]);
      }
      __syncthreads();
      warp_gemm_pair<kNT64, false, true>(dP, dos, dA, dr, vd, m0, n0, kHalf);
      warp_gemm_pair<kNT128, false, true>(dq, dosd, dk, dks, st, m0, n1, kHalf);
      warp_gemm<1, kNT128, false, true>(dk, vdb, dst, m0, n1, kHalf);
      __syncthreads();
    }
    {  // the value head's tail: its indices recomputed once more
      const int tid = opaque(static_cast<int>(threadIdx.x));
      const int warp = tid / 32, part = warp / 4;
      const int m0 = 16 * (warp % 4), n0 = (64 / kParts) * part, n1 = (128 / kParts) * part;
      if (hv + 1 < (h + 1) * f.group) {
        issue_minv(hv + 1);
        issue_half(hv + 1, 0);
      }

      // dQK = Γ ⊙ dP (bf16), scratch = P ⊙ dP (strictly lower) for dγ.
      for_each_pair(dP, m0, n0, [&](int r, int c, float& x0, float& x1) {
        const bool row_in = r < L;
        // dP accumulated against dO: times scale here.
        const float g0 = row_in && c <= r ? f.scale * fast_exp(s.gamma[r] - s.gamma[c]) : 0.f;
        const float g1 = row_in && c + 1 <= r ? f.scale * fast_exp(s.gamma[r] - s.gamma[c + 1]) : 0.f;
        store_pair(dqk, r, c, g0 * x0, g1 * x1);
        s.scratch[r][c] = c < r ? g0 * s.qk[r][c] * x0 : 0.f;
        s.scratch[r][c + 1] = c + 1 < r ? g1 * s.qk[r][c + 1] * x1 : 0.f;
      });
      const float sds_total = [&] {
        float x = sds;
        for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
        if (tid % 32 == 0) s.red[warp] = x;
        __syncthreads();
        float total = 0.f;
        for (int i = 0; i < kThreads / 32; ++i) total += s.red[i];
        return total;
      }();
      if (tid < 4 * kChunk) {  // P ⊙ dP (zero outside the strict lower triangle): row sums minus
                               // column sums, four threads a row, each over 16 indices, summed in a fixed order
        const int t = tid / 4, j0 = 16 * (tid % 4);
        float acc = 0.f;
  #pragma unroll 4
        for (int j = j0; j < j0 + 16; ++j) acc += s.scratch[t][j] - s.scratch[j][t];
        acc = quad_sum(acc);
        if (tid % 4 == 0) s.dgam[t] = acc;
      }
      __syncthreads();
      // scratch = dA ⊙ Γ (strictly lower; dA = −dR Vdᵀ)
      for_each_pair(dA, m0, n0, [&](int r, int c, float& x0, float& x1) {
        const bool row_in = r < L;
        s.scratch[r][c] = row_in && c < r ? -fast_exp(s.gamma[r] - s.gamma[c]) * x0 : 0.f;
        s.scratch[r][c + 1] = row_in && c + 1 < r ? -fast_exp(s.gamma[r] - s.gamma[c + 1]) * x1 : 0.f;
      });
      __syncthreads();
      // dasym = β_i dAΓ_ij + β_j dAΓ_ji; dβ, dγ from dA ⊙ Γ ⊙ K̂K̂ᵀ and the row sums.
  #pragma unroll 1
      for (int i = opaque(static_cast<int>(threadIdx.x)); i < kChunk * kChunk / 2; i += kThreads) {
        const int r = i / (kChunk / 2), c = 2 * (i % (kChunk / 2));
        store_pair(dasym, r, c, s.beta[r] * s.scratch[r][c] + s.beta[c] * s.scratch[c][r],
                   s.beta[r] * s.scratch[r][c + 1] + s.beta[c + 1] * s.scratch[c + 1][r]);
      }
      if (tid < 4 * kChunk) {  // dA ⊙ Γ (zero outside the strict lower triangle and past L) ⊙ K̂K̂ᵀ by
                               // rows and columns, four threads a row as above
        const int t = tid / 4, j0 = 16 * (tid % 4);
        float row = 0.f, col = 0.f;
  #pragma unroll 4
        for (int j = j0; j < j0 + 16; ++j) {
          row += s.scratch[t][j] * s.kk[t][j];
          col += s.beta[j] * s.scratch[j][t] * s.kk[j][t];
        }
        row = quad_sum(row);
        col = quad_sum(col);
        if (tid % 4 == 0) {
          const float udr = row_total(s.row_udr, t);
          const float ksdr = row_total(s.row_ksdr, t);
          const float xr = t < L - 1 ? row_total(s.row_x, t) : 0.f;
          s.dbet[t] = row + udr;
          s.dgam[t] += s.beta[t] * row - col + f.scale * s.eg[t] * row_total(s.row_q, t) -
                       s.eg[t] * s.beta[t] * ksdr - xr;
          s.row_x[0][t] = xr;  // kept for dγ_last
        }
      }
      __syncthreads();
      // dγ_last gets e^{γ_L} <S, dS'> and Σ x; then dg_t = Σ_{i ≥ t} dγ_i.
      float xs = tid < kChunk ? s.row_x[0][tid] : 0.f;
      xs = chunk_scan(xs, &s.carry, true);  // thread 0: Σ_j x_j
      if (tid == 0) s.dgam[L - 1] += s.eg[L - 1] * sds_total + xs;
      __syncthreads();
      float dgv = tid < L ? s.dgam[tid] : 0.f;
      dgv = chunk_scan(dgv, &s.carry, true);
      if (tid < L) {
        const int64_t t = cr.t0 + tid;
        float db = s.dbet[tid];
        if (f.beta_activation != FLASHQLA_BETA_IDENTITY) {
          const float raw = load_float(f.beta, f.beta_dtype, cr.row * f.beta_sb + t * f.beta_st + hv);
          db *= activate_beta_grad(raw, f.beta_activation);
        }
        store_float(a.dbeta, a.dbeta_dtype, cr.row * a.dbeta_sb + t * a.dbeta_st + hv, db);
        store_float(a.dg, a.dg_dtype, cr.row * a.dg_sb + t * a.dg_st + hv, dgv);
      }
      warp_gemm<1, kNT128, false, false>(dq, dqk, k, m0, n1, kChunk);
      warp_gemm<1, kNT128, true, false>(dk, dqk, q, m0, n1, kChunk);
      warp_gemm<1, kNT128, false, false>(dk, dasym, k, m0, n1, kChunk);
      __syncthreads();
    }
  }

  // The l2norm backward (dx = r (dy − y (y · dy)), y = x r, from the raw rows),
  // then dq and dk rows < L (the thread's indices recomputed, as in the loop).
  const int tid_f = opaque(static_cast<int>(threadIdx.x));
  const int g = (tid_f % 32) / 4, part_f = tid_f / 128;
  const int m0_f = 16 * ((tid_f / 32) % 4), n1_f = (128 / kParts) * part_f;
  // The raw q and k rows, into the (now free) state tiles' memory.
  const Tile raw_q{s.s, kLdWide}, raw_k{s.ds, kLdWide};
  static_assert(sizeof(GradsSmem::s) >= sizeof(bf16) * kChunk * kLdWide, "a state tile holds 64 raw rows");
  if (f.use_qk_l2norm) {
    load_rows<kThreads, kDim>(raw_q, static_cast<const bf16*>(f.q) + cr.row * f.q_sb + cr.t0 * f.q_st + h * f.q_sh,
                              f.q_st, L);
    load_rows<kThreads, kDim>(raw_k, static_cast<const bf16*>(f.k) + cr.row * f.k_sb + cr.t0 * f.k_st + h * f.k_sh,
                              f.k_st, L);
    wait_async_copies();
    __syncthreads();
  }
  auto finish = [&](float(&d)[1][kNT128][4], const Tile& raw, void* out, int64_t ob, int64_t ost, int64_t osh,
                    flashqla_dtype_t odt) {
    const bool pairs = bf16_pairs(out, odt, ob, ost, osh);
    if (f.use_qk_l2norm) {
      for (int i = tid_f; i < kParts * kChunk; i += kThreads) {
        (&s.row_sq[0][0])[i] = 0.f;
        (&s.row_dot[0][0])[i] = 0.f;
      }
      __syncthreads();
      float sq_lo = 0.f, sq_hi = 0.f, dot_lo = 0.f, dot_hi = 0.f;
      for_each_pair_at(d, m0_f, n1_f, [&](int, int, int hh, int r, int c, float& x0, float& x1) {
        const float2 xv = Mma::unpack(*reinterpret_cast<const uint32_t*>(raw.at(r, c)));
        const float sq = xv.x * xv.x + xv.y * xv.y, dot = xv.x * x0 + xv.y * x1;
        if (hh == 0) {
          sq_lo += sq;
          dot_lo += dot;
        } else {
          sq_hi += sq;
          dot_hi += dot;
        }
      });
      add_row(s.row_sq, part_f, m0_f + g, sq_lo);
      add_row(s.row_sq, part_f, m0_f + g + 8, sq_hi);
      add_row(s.row_dot, part_f, m0_f + g, dot_lo);
      add_row(s.row_dot, part_f, m0_f + g + 8, dot_hi);
      __syncthreads();
      for_each_pair(d, m0_f, n1_f, [&](int r, int c, float& x0, float& x1) {
        const float2 xv = Mma::unpack(*reinterpret_cast<const uint32_t*>(raw.at(r, c)));
        const float rs = rsqrtf(row_total(s.row_sq, r) + 1e-6f);
        const float ydy = rs * row_total(s.row_dot, r);  // y · dy
        x0 = rs * (x0 - xv.x * rs * ydy);
        x1 = rs * (x1 - xv.y * rs * ydy);
      });
      __syncthreads();
    }
    for_each_pair(d, m0_f, n1_f, [&](int r, int c, float& x0, float& x1) {
      if (r < L) {
        const int64_t o = cr.row * ob + (cr.t0 + r) * ost + h * osh + c;
        store_float_pair(out, odt, o, x0, x1, pairs);
      }
    });
  };
  finish(dq, raw_q, a.dq, a.dq_sb, a.dq_st, a.dq_sh, a.dq_dtype);
  finish(dk, raw_k, a.dk, a.dk_sb, a.dk_st, a.dk_sh, a.dk_dtype);
}

}  // namespace

cudaError_t launch_gdn_bwd_tc_grads(const BackwardArgs& args, cudaStream_t stream) {
  const size_t smem = sizeof(GradsSmem);
  cudaError_t err = cudaFuncSetAttribute(gdn_bwd_tc_grads_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  if (args.chunk_slots == 0 || args.f.H == 0) return cudaSuccess;
  gdn_bwd_tc_grads_kernel<<<dim3(static_cast<unsigned>(args.chunk_slots), static_cast<unsigned>(args.f.H)), kThreads,
                            smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
