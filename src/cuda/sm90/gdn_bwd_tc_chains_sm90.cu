// The tensor-core backward, step 2 of 3: the two serial chains, one CTA each
// per (sequence, value head, 32-column V tile), both directions in one launch
// (blockIdx.y). Each keeps its state slice in fp32 registers (warp w: key rows
// 16 w .. 16 w + 15) and stores it in bf16 at every chunk for step 3:
//   forward   S entering each chunk:  Vd = U0 − W S,
//             S' = e^{γ_L} S + K̂ᵀ diag(e^{γ_L − γ}) Vd
//   backward  dS leaving each chunk:  dVd = Z + diag(e^{γ_L − γ}) K̂ dS',
//             dS = e^{γ_L} dS' + (scale diag(e^γ) Q̂)ᵀ dO − Wᵀ dVd
//             (scale e^γ Q̂ as bf16 hi + lo: the term that dominates dS)
// and the backward writes dS before the first chunk as d_initial_state.
#include "cuda/sm90/gdn_bwd_tc_sm90.h"

#include "cuda/sm90/gdn_bwd_tc/common.cuh"

namespace flashqla::cuda {
namespace {

using namespace bwd;

constexpr int kThreads = 256;
constexpr int kVt = 32;           // value columns a CTA
constexpr int kLdVt = kVt + 8;    // 80-byte rows
constexpr int kTiles = kDim / kVt;

struct ChainSmem {
  // x, xl: scale e^γ Q̂ as bf16 hi + lo (backward)
  bf16 k[kChunk * kLdWide], x[kChunk * kLdWide], xl[kChunk * kLdWide], w[kChunk * kLdWide];
  bf16 st[kDim * kLdVt];     // the state slice in bf16: the B operand of W S / K̂ dS'
  bf16 in[kChunk * kLdVt];   // U0 (forward) or Z (backward) columns
  bf16 dos[kChunk * kLdVt];  // dO columns (backward)
  bf16 vd[kChunk * kLdVt];   // diag(e^{γ_L − γ}) Vd (forward) or −dVd (backward)
  float gamma[kChunk], eg[kChunk], b[kChunk], carry;
};

__global__ void __launch_bounds__(kThreads, 1) gdn_bwd_tc_chain_kernel(const BackwardArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ChainSmem& s = *reinterpret_cast<ChainSmem*>(smem_raw);
  const ForwardArgs& f = a.f;
  const int64_t v0 = (int64_t(blockIdx.x) % kTiles) * kVt;
  const int64_t hv = (int64_t(blockIdx.x) / kTiles) % f.HV, n = int64_t(blockIdx.x) / kTiles / f.HV;
  const int64_t h = hv / f.group;
  const bool backward = blockIdx.y == 1;
  const bool varlen = f.cu_seqlens != nullptr;
  const SequenceRange seq = sequence_range(f.cu_seqlens, f.cu_seqlens_int64, f.T, n);
  const int64_t n_chunks = (seq.eos - seq.bos + kChunk - 1) / kChunk;
  const int tid = threadIdx.x, warp = tid / 32;
  const Tile k{s.k, kLdWide}, x{s.x, kLdWide}, xl{s.xl, kLdWide}, w{s.w, kLdWide}, st{s.st, kLdVt}, in{s.in, kLdVt}, dos{s.dos, kLdVt},
      vd{s.vd, kLdVt};
  const int m0 = 16 * warp;

  // The state slice: S from h0 (forward) or dS from dht (backward), zero without.
  float S[1][4][4];
  {
    const void* src = backward ? a.dht : f.h0;
    const flashqla_dtype_t dtype = backward ? a.dht_dtype : f.h0_dtype;
    const int64_t sn = backward ? a.dht_sn : f.h0_sn, sh = backward ? a.dht_sh : f.h0_sh;
    const int64_t s2 = backward ? a.dht_s2 : f.h0_s2, s3 = backward ? a.dht_s3 : f.h0_s3;
    for_each_pair(S, m0, 0, [&](int r, int c, float& x0, float& x1) {
      x0 = src ? load_float(src, dtype, state_offset(n, hv, r, v0 + c, sn, sh, s2, s3, f.state_v_first)) : 0.f;
      x1 = src ? load_float(src, dtype, state_offset(n, hv, r, v0 + c + 1, sn, sh, s2, s3, f.state_v_first)) : 0.f;
    });
  }
  uint16_t* const states = backward ? a.dstates : a.states;
  for (int64_t ci = 0; ci < n_chunks; ++ci) {
    const int64_t c = backward ? n_chunks - 1 - ci : ci;
    const int64_t t0 = seq.bos + c * kChunk;
    const int L = int(min64(kChunk, seq.eos - t0));
    const int64_t slot = chunk_slot(n, c, seq.bos, f.T, varlen);
    uint16_t* const gs = states + (slot * f.HV + hv) * kDim * kDim + v0;
    for_each_pair(S, m0, 0, [&](int r, int col, float& x0, float& x1) {
      store_pair(st, r, col, x0, x1);
      store_pair(gs + r * kDim + col, x0, x1);
    });
    const int64_t tok = token_index(seq.row, t0, f.T, hv, f.HV, kDim);
    load_rows<kThreads, kDim>(k, static_cast<const bf16*>(f.k) + seq.row * f.k_sb + t0 * f.k_st + h * f.k_sh, f.k_st,
                              L);
    load_rows<kThreads, kDim>(w, reinterpret_cast<const bf16*>(a.w) + tok, f.HV * kDim, L);
    load_rows<kThreads, kVt>(in, reinterpret_cast<const bf16*>(backward ? a.z : a.u0) + tok + v0, f.HV * kDim, L);
    if (backward) {
      load_rows<kThreads, kDim>(x, static_cast<const bf16*>(f.q) + seq.row * f.q_sb + t0 * f.q_st + h * f.q_sh,
                                f.q_st, L);
      load_rows<kThreads, kVt>(
          dos, static_cast<const bf16*>(a.d_o) + seq.row * a.do_sb + t0 * a.do_st + hv * a.do_sh + v0, a.do_st, L);
    }
    float g = tid < L ? load_float(f.g, f.g_dtype, seq.row * f.g_sb + (t0 + tid) * f.g_st + hv) : 0.f;
    g = chunk_scan(g, &s.carry, false);
    if (tid < kChunk) s.gamma[tid] = g;
    wait_async_copies();
    __syncthreads();
    scale_rows<kThreads>(k, L, f.use_qk_l2norm, [](int) { return 1.f; });
    if (tid < kChunk) {
      s.eg[tid] = expf(s.gamma[tid]);
      s.b[tid] = expf(s.gamma[L - 1] - s.gamma[tid]);
    }
    __syncthreads();
    if (backward) split_rows<kThreads>(x, xl, L, f.use_qk_l2norm, [&](int r) { return f.scale * s.eg[r]; });
    // The 64 x 32 chunk products: rows 16 (warp % 4), columns 16 (warp / 4).
    float acc[1][2][4];
    zero(acc);
    const Tile lhs{backward ? s.k : s.w, kLdWide};  // K̂ dS' or W S
    const int pm = 16 * (warp % 4), pn = 16 * (warp / 4);
    warp_gemm<1, 2, false, false>(acc, lhs, st, pm, pn, kDim);
    for_each_pair(acc, pm, pn, [&](int r, int col, float& x0, float& x1) {
      const float2 base = Mma::unpack(*reinterpret_cast<const uint32_t*>(in.at(r, col)));
      if (backward) {  // −dVd = −(Z + b K̂ dS')
        store_pair(vd, r, col, -(base.x + s.b[r] * x0), -(base.y + s.b[r] * x1));
      } else {  // b (U0 − W S)
        store_pair(vd, r, col, s.b[r] * (base.x - x0), s.b[r] * (base.y - x1));
      }
    });
    __syncthreads();
    const float el = s.eg[L - 1];
    for_each_pair(S, m0, 0, [&](int, int, float& x0, float& x1) {
      x0 *= el;
      x1 *= el;
    });
    if (backward) {
      warp_gemm<1, 4, true, false>(S, x, dos, m0, 0, kChunk);
      warp_gemm<1, 4, true, false>(S, xl, dos, m0, 0, kChunk);
      warp_gemm<1, 4, true, false>(S, w, vd, m0, 0, kChunk);
    } else {
      warp_gemm<1, 4, true, false>(S, k, vd, m0, 0, kChunk);
    }
    __syncthreads();
  }
  if (backward && a.dh0 != nullptr) {
    for_each_pair(S, m0, 0, [&](int r, int c, float& x0, float& x1) {
      store_float(a.dh0, a.dh0_dtype,
                  state_offset(n, hv, r, v0 + c, a.dh0_sn, a.dh0_sh, a.dh0_s2, a.dh0_s3, f.state_v_first), x0);
      store_float(a.dh0, a.dh0_dtype,
                  state_offset(n, hv, r, v0 + c + 1, a.dh0_sn, a.dh0_sh, a.dh0_s2, a.dh0_s3, f.state_v_first), x1);
    });
  }
}

}  // namespace

cudaError_t launch_gdn_bwd_tc_chains(const BackwardArgs& args, cudaStream_t stream) {
  const size_t smem = sizeof(ChainSmem);
  cudaError_t err = cudaFuncSetAttribute(gdn_bwd_tc_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const int64_t blocks = kTiles * args.f.HV * args.f.N;
  if (blocks == 0) return cudaSuccess;
  gdn_bwd_tc_chain_kernel<<<dim3(static_cast<unsigned>(blocks), 2), kThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
