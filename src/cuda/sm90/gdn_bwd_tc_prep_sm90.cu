// The tensor-core backward, step 1 of 3: what each chunk needs that depends on
// no state, computed for every (chunk, q/k head) at once, the head's GQA group of
// value heads in turn (q̂, k̂, their norms and Q̂ K̂ᵀ once for the group). From q̂,
// k̂, v, dO, g and β of one chunk and value head:
//   A    = StrictLower(diag(β) (Γ ⊙ K̂ K̂ᵀ)),  M = (I + A)⁻¹   (fp32 in shared memory)
//   W    = M diag(β e^γ) K̂     the state's pull on the chunk's deltas
//   U0   = M diag(β) V         the deltas from a zero state (Vd = U0 − W S)
//   Z    = (scale P)ᵀ dO,  P = Γ ⊙ Q̂ K̂ᵀ (lower, diagonal included; scale folded
//          into P's one rounding to bf16, dO exact)
// (W and U0 as (M diag(β e^γ)) K̂ and (M diag(β)) V: the diagonal scales M's columns
// in its one rounding to bf16, so K̂ and V stay as loaded for the group's next value
// head.) W, U0, Z and M go to the workspace in bf16, per token and value head, with
// the chains' row factors in fp32 (BackwardArgs::rows).
#include "cuda/sm90/gdn_bwd_tc_sm90.h"

#include "cuda/sm90/gdn_bwd_tc/common.cuh"
#include "cuda/sm90/unit_lower_inverse.cuh"

namespace flashqla::cuda {
namespace {

using namespace bwd;

constexpr int kThreads = 256;
constexpr int kLdAT = 20;  // row stride of the transposed 16x16 diagonal blocks of A (float4 rows)

// 112 KB: two CTAs a SM. Regions are reused once their contents are dead.
struct PrepSmem {
  union {
    bf16 q[kChunk * kLdWide];      // Q̂, until Q̂ K̂ᵀ
    float at[4][16][kLdAT];        // then, each value head, A's diagonal 16x16 blocks transposed
    float t[kChunk][kChunk + 1];   // then the blocked inverse's products
    bf16 p[kChunk * kLdHalf];      // then scale P
  } r0;
  bf16 k[kChunk * kLdWide];        // K̂, for every value head of the group
  bf16 vb[kChunk * kLdWide];       // the value head's V
  bf16 dos[kChunk * kLdWide];      // its dO
  union {
    float a[kChunk][kChunk + 1];   // A, until inverted
    struct {
      bf16 k[kChunk * kLdHalf];    // then M diag(β e^γ) in bf16
      bf16 v[kChunk * kLdHalf];    // and M diag(β)
    } m;
  } r1;
  float minv[kChunk][kChunk + 1];
  float qk[kChunk * (kChunk + 1) / 2];  // Q̂ K̂ᵀ, its lower triangle with the diagonal, by rows
  float gamma[kChunk], beta[kChunk], eg[kChunk], rq[kChunk], rk[kChunk], carry;
};
static_assert(2 * (sizeof(PrepSmem) + 1024) <= 228 * 1024, "two prep CTAs a SM");

__device__ __forceinline__ int lower_index(int r, int c) { return r * (r + 1) / 2 + c; }

// C (16 rows x 8 columns, an m16n8 accumulator) += A (16 x kK) B (kK x 8), both
// fp32 row-major in shared memory, multiplied in tf32 from k-step k_first / 8 on
// (the steps before contribute nothing where B is lower triangular).
template <int kK>
__device__ __forceinline__ void mma_rows_tf32(float (&c)[4], const float* a, const float* b, int k_first, int lane) {
  constexpr int ld = kChunk + 1;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int k0 = 0; k0 < kK; k0 += 8) {
    if (k0 < k_first) continue;
    const uint32_t af[4] = {mma::to_tf32(a[g * ld + k0 + t]), mma::to_tf32(a[(g + 8) * ld + k0 + t]),
                            mma::to_tf32(a[g * ld + k0 + t + 4]), mma::to_tf32(a[(g + 8) * ld + k0 + t + 4])};
    mma::mma_tf32_m16n8k8(c, af, mma::to_tf32(b[(k0 + t) * ld + g]), mma::to_tf32(b[(k0 + t + 4) * ld + g]));
  }
}

// M = (I + A)⁻¹ for A strictly lower (64x64 fp32; M holds the identity on
// entry; at[b] A's diagonal block b transposed), in three levels: the four 16x16
// diagonal blocks by forward substitution in registers (warp b block b, a lane a
// column: unit_lower_inverse_column16); then the block below each
// 32x32 diagonal block's diagonal, M_10 = −(M_11 A_10) M_00 (warps 0 and 1, one
// block each, tf32 mma); then the 32x32 block below the diagonal,
// M_10 = −(M_11 A_10) M_00 again with 32x32 blocks (every warp a 16x8 tile of
// each product, the first product through t). Ends with a barrier.
__device__ __noinline__ void invert_unit_lower(float (&a)[kChunk][kChunk + 1], const float (&at)[4][16][kLdAT],
                                  float (&m)[kChunk][kChunk + 1], float (&t)[kChunk][kChunk + 1]) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, q = lane & 3;
  if (warp < 4) {
    // Both half-warps compute the whole column; lanes ..15 store rows 0..7,
    // lanes 16.. rows 8..15 (on and above the diagonal: the identity's 1 and 0).
    const int o = 16 * warp, c = lane % 16;
    const bool upper = lane >= 16;
    float x[16];
    unit_lower_inverse_column16<kLdAT>(&at[warp][0][0], c, x);
#pragma unroll
    for (int e = 0; e < 8; ++e) m[o + e + (upper ? 8 : 0)][o + c] = upper ? x[e + 8] : x[e];
  }
  __syncthreads();
  if (warp < 2) {  // 16x16 blocks below the diagonal of the 32x32 block at o
    const int o = 32 * warp;
    float x[2][4] = {};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) mma_rows_tf32<16>(x[nt], &m[o + 16][o + 16], &a[o + 16][o + 8 * nt], 0, lane);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      t[o + 16 + g][o + 8 * nt + 2 * q] = x[nt][0];
      t[o + 16 + g][o + 8 * nt + 2 * q + 1] = x[nt][1];
      t[o + 24 + g][o + 8 * nt + 2 * q] = x[nt][2];
      t[o + 24 + g][o + 8 * nt + 2 * q + 1] = x[nt][3];
    }
    __syncwarp();
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      float y[4] = {};
      mma_rows_tf32<16>(y, &t[o + 16][o], &m[o][o + 8 * nt], 8 * nt, lane);
      m[o + 16 + g][o + 8 * nt + 2 * q] = -y[0];
      m[o + 16 + g][o + 8 * nt + 2 * q + 1] = -y[1];
      m[o + 24 + g][o + 8 * nt + 2 * q] = -y[2];
      m[o + 24 + g][o + 8 * nt + 2 * q + 1] = -y[3];
    }
  }
  __syncthreads();
  // The 32x32 block at rows 32, columns 0: warp w the 16x8 tile at rows 16 (w / 4),
  // columns 8 (w % 4) of each product.
  const int r0 = 16 * (warp / 4), c0 = 8 * (warp % 4);
  {
    float x[4] = {};  // (M_11 A_10) tile; M_11's rows r0.. are zero past column r0 + 16
    if (r0 == 0) {
      mma_rows_tf32<16>(x, &m[32][32], &a[32][c0], 0, lane);
    } else {
      mma_rows_tf32<32>(x, &m[48][32], &a[32][c0], 0, lane);
    }
    t[32 + r0 + g][c0 + 2 * q] = x[0];
    t[32 + r0 + g][c0 + 2 * q + 1] = x[1];
    t[40 + r0 + g][c0 + 2 * q] = x[2];
    t[40 + r0 + g][c0 + 2 * q + 1] = x[3];
  }
  __syncthreads();
  {
    float y[4] = {};  // M_00 is zero above its diagonal: k from c0
    mma_rows_tf32<32>(y, &t[32 + r0][0], &m[0][c0], c0, lane);
    m[32 + r0 + g][c0 + 2 * q] = -y[0];
    m[32 + r0 + g][c0 + 2 * q + 1] = -y[1];
    m[40 + r0 + g][c0 + 2 * q] = -y[2];
    m[40 + r0 + g][c0 + 2 * q + 1] = -y[3];
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 2) gdn_bwd_tc_prep_kernel(const BackwardArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  PrepSmem& s = *reinterpret_cast<PrepSmem*>(smem_raw);
  const ForwardArgs& f = a.f;
  const ChunkRef cr = chunk_of_slot(f, blockIdx.x);
  if (!cr.valid) return;
  const int64_t h = blockIdx.y, hv0 = h * f.group;
  const int L = cr.L, tid = threadIdx.x, warp = tid / 32;
  const Tile q{s.r0.q, kLdWide}, k{s.k, kLdWide}, vb{s.vb, kLdWide}, dos{s.dos, kLdWide};
  const Tile p{s.r0.p, kLdHalf}, mk{s.r1.m.k, kLdHalf}, mv{s.r1.m.v, kLdHalf};
  auto load_value_head = [&](int64_t hv) {
    load_rows<kThreads, kDim>(vb, static_cast<const bf16*>(f.v) + cr.row * f.v_sb + cr.t0 * f.v_st + hv * f.v_sh,
                              f.v_st, L);
    load_rows<kThreads, kDim>(dos,
                              static_cast<const bf16*>(a.d_o) + cr.row * a.do_sb + cr.t0 * a.do_st + hv * a.do_sh,
                              a.do_st, L);
    commit_async_copies();  // (wait_group counts committed groups only)
  };

  load_rows<kThreads, kDim>(q, static_cast<const bf16*>(f.q) + cr.row * f.q_sb + cr.t0 * f.q_st + h * f.q_sh, f.q_st, L);
  load_rows<kThreads, kDim>(k, static_cast<const bf16*>(f.k) + cr.row * f.k_sb + cr.t0 * f.k_st + h * f.k_sh, f.k_st, L);
  commit_async_copies();  // q and k first: their norms and Q̂ K̂ᵀ run while v and dO land
  load_value_head(hv0);
  wait_async_copies_but<1>();
  __syncthreads();
  scale_rows<kThreads>(q, L, f.use_qk_l2norm, [](int) { return 1.f; }, s.rq);
  scale_rows<kThreads>(k, L, f.use_qk_l2norm, [](int) { return 1.f; }, s.rk);
  __syncthreads();
  // Q̂ K̂ᵀ once for the group, its lower triangle into shared memory (read back after
  // each value head's inverse, over Q̂'s memory by then); K̂ K̂ᵀ each value head
  // (K̂ stays), where registers are short.
  const int pm0 = 16 * (warp % 4), pn0 = 32 * (warp / 4);
  {
    float qk[1][4][4];
    zero(qk);
    warp_gemm<1, 4, false, true>(qk, q, k, pm0, pn0, kDim);
    for_each_pair(qk, pm0, pn0, [&](int r, int c, float& x0, float& x1) {
      if (c <= r) s.qk[lower_index(r, c)] = x0;
      if (c + 1 <= r) s.qk[lower_index(r, c + 1)] = x1;
    });
  }
  for (int64_t j = 0; j < f.group; ++j) {
    const int64_t hv = hv0 + j;
    float g = load_chunk_gates(f, cr, hv, s.beta);
    g = chunk_scan(g, &s.carry, false);  // γ; padded rows repeat the last value
    if (tid < kChunk) s.gamma[tid] = g;
    __syncthreads();
    if (tid < kChunk) {
      s.eg[tid] = expf(g);
      if (tid < L) {  // the chains' row factors
        const float gl = s.gamma[L - 1];
        a.rows[token_index(cr.row, cr.t0 + tid, f.T, hv, f.HV, 1)] =
            make_float4(expf(gl - g) * s.rk[tid], f.scale * expf(g) * s.rq[tid], expf(gl), g);
      }
    }
    {  // K̂ K̂ᵀ -> A (fp32)
      float kk[1][4][4];
      zero(kk);
      warp_gemm<1, 4, false, true>(kk, k, k, pm0, pn0, kDim);
      for_each_pair(kk, pm0, pn0, [&](int r, int c, float& x0, float& x1) {
        const bool row_in = r < L;
        const float a0 = row_in && c < r ? s.beta[r] * fast_exp(s.gamma[r] - s.gamma[c]) * x0 : 0.f;
        const float a1 = row_in && c + 1 < r ? s.beta[r] * fast_exp(s.gamma[r] - s.gamma[c + 1]) * x1 : 0.f;
        s.r1.a[r][c] = a0;
        s.r1.a[r][c + 1] = a1;
        if (r / 16 == c / 16) {  // a diagonal block's entries, transposed too (c even: c + 1 in the same block)
          s.r0.at[r / 16][c % 16][r % 16] = a0;
          s.r0.at[r / 16][c % 16 + 1][r % 16] = a1;
        }
      });
    }
    for (int i = tid; i < kChunk * kChunk; i += kThreads) s.minv[i / kChunk][i % kChunk] = i / kChunk == i % kChunk;
    wait_async_copies();  // this value head's v and dO
    __syncthreads();      // A (and its diagonal blocks transposed over Q̂, read before), the identity, e^γ in
    invert_unit_lower(s.r1.a, s.r0.at, s.minv, s.r0.t);
    // A and t are dead: scale P over t, M diag(β e^γ) and M diag(β) over A, M to the workspace.
    for (int i = tid; i < kChunk * kChunk / 2; i += kThreads) {
      const int r = i / (kChunk / 2), c = 2 * (i % (kChunk / 2));
      const bool row_in = r < L;
      store_pair(p, r, c, row_in && c <= r ? f.scale * fast_exp(s.gamma[r] - s.gamma[c]) * s.qk[lower_index(r, c)] : 0.f,
                 row_in && c + 1 <= r ? f.scale * fast_exp(s.gamma[r] - s.gamma[c + 1]) * s.qk[lower_index(r, c + 1)]
                                      : 0.f);
      const float x0 = s.minv[r][c], x1 = s.minv[r][c + 1];
      store_pair(mk, r, c, x0 * s.beta[c] * s.eg[c], x1 * s.beta[c + 1] * s.eg[c + 1]);
      store_pair(mv, r, c, x0 * s.beta[c], x1 * s.beta[c + 1]);
      if (row_in) store_pair(a.minv + token_index(cr.row, cr.t0 + r, f.T, hv, f.HV, kChunk) + c, x0, x1);
    }
    __syncthreads();
    // W = (M diag(β e^γ)) K̂, U0 = (M diag(β)) V, Z = (scale P)ᵀ dO: rows 16 (warp % 4),
    // columns 64 (warp / 4).
    const int m0 = 16 * (warp % 4), n0 = 64 * (warp / 4);
    auto store_rows = [&](uint16_t* dst, float(&acc)[1][8][4]) {
      for_each_pair(acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
        if (r < L) store_pair(dst + token_index(cr.row, cr.t0 + r, f.T, hv, f.HV, kDim) + c, x0, x1);
      });
    };
    {
      float w[1][8][4];
      zero(w);
      warp_gemm<1, 8, false, false>(w, mk, k, m0, n0, kChunk);
      store_rows(a.w, w);
    }
    {
      float u0[1][8][4];
      zero(u0);
      warp_gemm<1, 8, false, false>(u0, mv, vb, m0, n0, kChunk);
      store_rows(a.u0, u0);
    }
    {
      float acc[1][8][4];
      zero(acc);
      warp_gemm<1, 8, true, false>(acc, p, dos, m0, n0, kChunk);
      store_rows(a.z, acc);
    }
    __syncthreads();  // V, dO, P, the scaled M and the gates read: the next value head's go over them
    if (j + 1 < f.group) load_value_head(hv + 1);
  }
}

}  // namespace

cudaError_t launch_gdn_bwd_tc_prep(const BackwardArgs& args, cudaStream_t stream) {
  const size_t smem = sizeof(PrepSmem);
  cudaError_t err =
      cudaFuncSetAttribute(gdn_bwd_tc_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  if (args.chunk_slots == 0 || args.f.H == 0) return cudaSuccess;
  gdn_bwd_tc_prep_kernel<<<dim3(static_cast<unsigned>(args.chunk_slots), static_cast<unsigned>(args.f.H)), kThreads,
                           smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
