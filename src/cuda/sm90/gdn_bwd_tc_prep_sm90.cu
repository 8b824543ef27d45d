// The tensor-core backward, step 1 of 3: what each chunk needs that depends on
// no state, computed for every (chunk, value head) at once. From q̂, k̂, v, dO,
// g and β of one chunk:
//   A    = StrictLower(diag(β) (Γ ⊙ K̂ K̂ᵀ)),  M = (I + A)⁻¹   (fp32 in shared memory)
//   W    = M diag(β e^γ) K̂     the state's pull on the chunk's deltas
//   U0   = M diag(β) V         the deltas from a zero state (Vd = U0 − W S)
//   Z    = (scale P)ᵀ dO,  P = Γ ⊙ Q̂ K̂ᵀ (lower, diagonal included; scale folded
//          into P's one rounding to bf16, dO exact)
// W, U0, Z and M go to the workspace in bf16, per token and value head, with
// the chains' row factors in fp32 (BackwardArgs::rows).
#include "cuda/sm90/gdn_bwd_tc_sm90.h"

#include "cuda/sm90/gdn_bwd_tc/common.cuh"

namespace flashqla::cuda {
namespace {

using namespace bwd;

constexpr int kThreads = 256;

// 103 KB: two CTAs a SM. Regions are reused once their contents are dead.
struct PrepSmem {
  union {
    bf16 q[kChunk * kLdWide];      // Q̂, until Q̂ K̂ᵀ
    float t[kChunk][kChunk + 1];   // then the blocked inverse's products
    bf16 p[kChunk * kLdHalf];      // then scale P
  } r0;
  bf16 k[kChunk * kLdWide];        // K̂, then diag(β e^γ) K̂
  bf16 vb[kChunk * kLdWide];       // V, then diag(β) V
  bf16 dos[kChunk * kLdWide];      // dO
  union {
    float a[kChunk][kChunk + 1];   // A, until inverted
    bf16 mb[kChunk * kLdHalf];     // then M in bf16
  } r1;
  float minv[kChunk][kChunk + 1];
  float gamma[kChunk], beta[kChunk], eg[kChunk], rq[kChunk], rk[kChunk], carry;
};
static_assert(2 * (sizeof(PrepSmem) + 1024) <= 228 * 1024, "two prep CTAs a SM");

// M = (I + A)⁻¹ for A strictly lower (64x64 fp32; M holds the identity on
// entry), by 16x16 blocks: the four diagonal blocks by forward substitution
// (warp b block b, a lane a column), then the blocks below the diagonal by
// distance d = 1, 2, 3:  M_ij = −M_ii Σ_{j ≤ k < i} A_ik M_kj  (j = i − d).
__device__ void invert_unit_lower(float (&a)[kChunk][kChunk + 1], float (&m)[kChunk][kChunk + 1],
                                  float (&t)[kChunk][kChunk + 1]) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (warp < 4) {
    const int o = 16 * warp, c = lane % 16, part = lane / 16;
    for (int r = 1; r < 16; ++r) {
      float x = 0.f;
      if (c < r) {
        for (int k = c + part; k < r; k += 2) x += a[o + r][o + k] * m[o + k][o + c];
      }
      x += __shfl_xor_sync(0xffffffffu, x, 16);
      if (c < r && part == 0) m[o + r][o + c] = -x;
      __syncwarp();
    }
  }
  __syncthreads();
  for (int d = 1; d < 4; ++d) {
    const int blocks = 4 - d;  // (i, j) = (d + b, b)
    for (int e = tid; e < blocks * 256; e += kThreads) {
      const int b = e / 256, r = (e % 256) / 16, c = e % 16, i = d + b, j = b;
      float x = 0.f;
      for (int k = 16 * j; k < 16 * i; ++k) x += a[16 * i + r][k] * m[k][16 * j + c];
      t[16 * i + r][16 * j + c] = x;
    }
    __syncthreads();
    for (int e = tid; e < blocks * 256; e += kThreads) {
      const int b = e / 256, r = (e % 256) / 16, c = e % 16, i = d + b, j = b;
      float x = 0.f;
      for (int k = 0; k <= r; ++k) x += m[16 * i + r][16 * i + k] * t[16 * i + k][16 * j + c];
      m[16 * i + r][16 * j + c] = -x;
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads, 2) gdn_bwd_tc_prep_kernel(const BackwardArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  PrepSmem& s = *reinterpret_cast<PrepSmem*>(smem_raw);
  const ForwardArgs& f = a.f;
  const ChunkRef cr = chunk_of_slot(f, blockIdx.x);
  if (!cr.valid) return;
  const int64_t hv = blockIdx.y, h = hv / f.group;
  const int L = cr.L, tid = threadIdx.x, warp = tid / 32;
  const Tile q{s.r0.q, kLdWide}, k{s.k, kLdWide}, vb{s.vb, kLdWide}, dos{s.dos, kLdWide};
  const Tile mb{s.r1.mb, kLdHalf}, p{s.r0.p, kLdHalf};

  load_rows<kThreads, kDim>(q, static_cast<const bf16*>(f.q) + cr.row * f.q_sb + cr.t0 * f.q_st + h * f.q_sh, f.q_st, L);
  load_rows<kThreads, kDim>(k, static_cast<const bf16*>(f.k) + cr.row * f.k_sb + cr.t0 * f.k_st + h * f.k_sh, f.k_st, L);
  load_rows<kThreads, kDim>(vb, static_cast<const bf16*>(f.v) + cr.row * f.v_sb + cr.t0 * f.v_st + hv * f.v_sh, f.v_st,
                            L);
  load_rows<kThreads, kDim>(dos,
                            static_cast<const bf16*>(a.d_o) + cr.row * a.do_sb + cr.t0 * a.do_st + hv * a.do_sh,
                            a.do_st, L);
  float g = load_chunk_gates(f, cr, hv, s.beta);
  g = chunk_scan(g, &s.carry, false);  // γ; padded rows repeat the last value
  if (tid < kChunk) s.gamma[tid] = g;
  wait_async_copies();
  __syncthreads();
  scale_rows<kThreads>(q, L, f.use_qk_l2norm, [](int) { return 1.f; }, s.rq);
  scale_rows<kThreads>(k, L, f.use_qk_l2norm, [](int) { return 1.f; }, s.rk);
  __syncthreads();
  if (tid < kChunk) {
    s.eg[tid] = expf(s.gamma[tid]);
    if (tid < L) {  // the chains' row factors
      const float gl = s.gamma[L - 1];
      a.rows[token_index(cr.row, cr.t0 + tid, f.T, hv, f.HV, 1)] =
          make_float4(expf(gl - g) * s.rk[tid], f.scale * expf(g) * s.rq[tid], expf(gl), g);
    }
  }
  __syncthreads();
  // K̂ K̂ᵀ -> A (fp32); Q̂ K̂ᵀ stays in registers until Q̂'s memory is free again.
  const int pm0 = 16 * (warp % 4), pn0 = 32 * (warp / 4);
  float qk[1][4][4];
  zero(qk);
  {
    float kk[1][4][4];
    zero(kk);
    warp_gemm_pair<4, false, true>(kk, k, qk, q, k, pm0, pn0, kDim);
    for_each_pair(kk, pm0, pn0, [&](int r, int c, float& x0, float& x1) {
      const bool row_in = r < L;
      s.r1.a[r][c] = row_in && c < r ? s.beta[r] * fast_exp(s.gamma[r] - s.gamma[c]) * x0 : 0.f;
      s.r1.a[r][c + 1] = row_in && c + 1 < r ? s.beta[r] * fast_exp(s.gamma[r] - s.gamma[c + 1]) * x1 : 0.f;
    });
  }
  for (int i = tid; i < kChunk * kChunk; i += kThreads) s.minv[i / kChunk][i % kChunk] = i / kChunk == i % kChunk;
  __syncthreads();  // Q̂ and K̂ read: K̂ becomes diag(β e^γ) K̂, V diag(β) V (pairs)
  for (int i = tid; i < kChunk * kDim / 2; i += kThreads) {
    const int r = i / (kDim / 2), c = 2 * (i % (kDim / 2));
    const float2 kv = Mma::unpack(*reinterpret_cast<const uint32_t*>(k.at(r, c)));
    const float2 vv = Mma::unpack(*reinterpret_cast<const uint32_t*>(vb.at(r, c)));
    const float be = s.beta[r] * s.eg[r];
    store_pair(k, r, c, kv.x * be, kv.y * be);
    store_pair(vb, r, c, vv.x * s.beta[r], vv.y * s.beta[r]);
  }
  invert_unit_lower(s.r1.a, s.minv, s.r0.t);
  // A and t are dead: M in bf16 over A, scale P over t.
  for_each_pair(qk, pm0, pn0, [&](int r, int c, float& x0, float& x1) {
    const bool row_in = r < L;
    store_pair(p, r, c, row_in && c <= r ? f.scale * fast_exp(s.gamma[r] - s.gamma[c]) * x0 : 0.f,
               row_in && c + 1 <= r ? f.scale * fast_exp(s.gamma[r] - s.gamma[c + 1]) * x1 : 0.f);
  });
  for (int i = tid; i < kChunk * kChunk / 2; i += kThreads) {
    const int r = i / (kChunk / 2), c = 2 * (i % (kChunk / 2));
    const float x0 = s.minv[r][c], x1 = s.minv[r][c + 1];
    store_pair(mb, r, c, x0, x1);
    if (r < L) store_pair(a.minv + token_index(cr.row, cr.t0 + r, f.T, hv, f.HV, kChunk) + c, x0, x1);
  }
  __syncthreads();
  // W = M diag(β e^γ) K̂, U0 = M diag(β) V, Z = (scale P)ᵀ dO: rows 16 (warp % 4), columns
  // 64 (warp / 4).
  const int m0 = 16 * (warp % 4), n0 = 64 * (warp / 4);
  auto store_rows = [&](uint16_t* dst, float(&acc)[1][8][4]) {
    for_each_pair(acc, m0, n0, [&](int r, int c, float& x0, float& x1) {
      if (r < L) store_pair(dst + token_index(cr.row, cr.t0 + r, f.T, hv, f.HV, kDim) + c, x0, x1);
    });
  };
  {
    float w[1][8][4], u0[1][8][4];
    zero(w);
    zero(u0);
    warp_gemm_shared_a<8>(w, k, u0, vb, mb, m0, n0, kChunk);
    store_rows(a.w, w);
    store_rows(a.u0, u0);
  }
  {
    float acc[1][8][4];
    zero(acc);
    warp_gemm<1, 8, true, false>(acc, p, dos, m0, n0, kChunk);
    store_rows(a.z, acc);
  }
}

}  // namespace

cudaError_t launch_gdn_bwd_tc_prep(const BackwardArgs& args, cudaStream_t stream) {
  const size_t smem = sizeof(PrepSmem);
  cudaError_t err =
      cudaFuncSetAttribute(gdn_bwd_tc_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  if (args.chunk_slots == 0 || args.f.HV == 0) return cudaSuccess;
  gdn_bwd_tc_prep_kernel<<<dim3(static_cast<unsigned>(args.chunk_slots), static_cast<unsigned>(args.f.HV)), kThreads,
                           smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
