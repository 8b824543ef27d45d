// The tensor-core backward, step 2 of 3: the two serial chains, one CTA each
// per (sequence, value head, 32-column V tile), both directions in one launch
// (blockIdx.y 0: the gradient chain, the longer, started first). Each keeps
// its state slice in fp32 registers (warp w: key rows 16 w .. 16 w + 15) and
// stores it in bf16 at every chunk for step 3:
//   state      S entering each chunk:  Vd = U0 − W S,
//              S' = e^{γ_L} S + K̂ᵀ diag(e^{γ_L − γ}) Vd
//   gradient   dS leaving each chunk:  dVd = Z + diag(e^{γ_L − γ}) K̂ dS',
//              dS = e^{γ_L} dS' + (scale diag(e^γ) Q̂)ᵀ dO − Wᵀ dVd
// and the gradient chain writes dS before the first chunk as d_initial_state.
//
// The chunk's tiles arrive by cp.async two chunks ahead (three stages), and k and
// q are used as loaded: their l2norm factors (from step 1, with the gates) scale the
// 64-row side instead, K̂ dS' = diag(r_k) (K dS') and
// K̂ᵀ diag(b) Vd = Kᵀ diag(r_k b) Vd; the term that dominates dS takes q exact
// and diag(scale e^γ r_q) dO as bf16 hi + lo (FLA keeps e^γ q in fp32; in one
// bf16 rounding d_initial_state's error was 5× FLA's). Two barriers a chunk.
#include "cuda/sm90/gdn_bwd_tc_sm90.h"

#include "cuda/sm90/gdn_bwd_tc/common.cuh"

namespace flashqla::cuda {
namespace {

using namespace bwd;

constexpr int kThreads = 256;
constexpr int kVt = 32;         // value columns a CTA
constexpr int kLdVt = kVt + 8;  // 80-byte rows
constexpr int kTiles = kDim / kVt;
constexpr int kStages = 3;      // chunk ci's tiles are loaded from chunk ci − 2 on

// One chunk's inputs (q and dO: the gradient chain only).
struct ChainStage {
  bf16 k[kChunk * kLdWide], w[kChunk * kLdWide], q[kChunk * kLdWide];
  bf16 in[kChunk * kLdVt];   // U0 (state chain) or Z (gradient chain) columns
  bf16 dos[kChunk * kLdVt];  // dO columns
  float4 rows[kChunk];       // BackwardArgs::rows; zero past the chunk's end
};

struct ChainSmem {
  ChainStage stage[kStages];  // chunk ci in stage ci % kStages
  bf16 st[kDim * kLdVt];     // the state slice in bf16: the B operand of W S / K dS'
  bf16 vd[kChunk * kLdVt];   // diag(r_k b) Vd (state chain) or −dVd (gradient chain)
  bf16 dhi[kChunk * kLdVt], dlo[kChunk * kLdVt];  // diag(scale e^γ r_q) dO, hi + lo
};

__global__ void __launch_bounds__(kThreads, 1) gdn_bwd_tc_chain_kernel(const BackwardArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  ChainSmem& s = *reinterpret_cast<ChainSmem*>(smem_raw);
  const ForwardArgs& f = a.f;
  const int64_t v0 = (int64_t(blockIdx.x) % kTiles) * kVt;
  const int64_t hv = (int64_t(blockIdx.x) / kTiles) % f.HV, n = int64_t(blockIdx.x) / kTiles / f.HV;
  const int64_t h = hv / f.group;
  const bool grad = blockIdx.y == 0;
  const bool varlen = f.cu_seqlens != nullptr;
  const SequenceRange seq = sequence_range(f.cu_seqlens, f.cu_seqlens_int64, f.T, n);
  const int64_t n_chunks = (seq.eos - seq.bos + kChunk - 1) / kChunk;
  const int tid = threadIdx.x, warp = tid / 32;
  const Tile st{s.st, kLdVt}, vd{s.vd, kLdVt}, dhi{s.dhi, kLdVt}, dlo{s.dlo, kLdVt};
  const int m0 = 16 * warp;
  const bf16* const k_base = static_cast<const bf16*>(f.k) + seq.row * f.k_sb + h * f.k_sh;
  const bf16* const q_base = static_cast<const bf16*>(f.q) + seq.row * f.q_sb + h * f.q_sh;
  const bf16* const do_base = static_cast<const bf16*>(a.d_o) + seq.row * a.do_sb + hv * a.do_sh + v0;
  const bf16* const w_base = reinterpret_cast<const bf16*>(a.w);
  const bf16* const in_base = reinterpret_cast<const bf16*>(grad ? a.z : a.u0) + v0;

  // Chunk ci of the chain's order (the gradient chain runs from the last).
  auto chunk_at = [&](int64_t ci) { return grad ? n_chunks - 1 - ci : ci; };
  const RowCopy<kThreads, kDim> wide;
  const RowCopy<kThreads, kVt> narrow;
  auto issue_loads = [&](int64_t ci, ChainStage& g) {
    const int64_t t0 = seq.bos + chunk_at(ci) * kChunk;
    const int L = int(min64(kChunk, seq.eos - t0));
    const int64_t tok = token_index(seq.row, t0, f.T, hv, f.HV, kDim);
    wide.issue(Tile{g.k, kLdWide}, k_base + t0 * f.k_st, f.k_st, L);
    wide.issue(Tile{g.w, kLdWide}, w_base + tok, f.HV * kDim, L);
    narrow.issue(Tile{g.in, kLdVt}, in_base + tok, f.HV * kDim, L);
    if (tid < kChunk) {
      const float4* const src = a.rows + tok / kDim;
      copy_async_16(&g.rows[tid], tid < L ? src + tid * f.HV : src, tid < L);
    }
    if (grad) {
      wide.issue(Tile{g.q, kLdWide}, q_base + t0 * f.q_st, f.q_st, L);
      narrow.issue(Tile{g.dos, kLdVt}, do_base + t0 * a.do_st, a.do_st, L);
    }
  };

  // The state slice: S from h0 (state chain) or dS from dht (gradient chain), zero without.
  float S[1][4][4];
  {
    const void* src = grad ? a.dht : f.h0;
    const flashqla_dtype_t dtype = grad ? a.dht_dtype : f.h0_dtype;
    const int64_t sn = grad ? a.dht_sn : f.h0_sn, sh = grad ? a.dht_sh : f.h0_sh;
    const int64_t s2 = grad ? a.dht_s2 : f.h0_s2, s3 = grad ? a.dht_s3 : f.h0_s3;
    for_each_pair(S, m0, 0, [&](int r, int c, float& x0, float& x1) {
      x0 = src ? load_float(src, dtype, state_offset(n, hv, r, v0 + c, sn, sh, s2, s3, f.state_v_first)) : 0.f;
      x1 = src ? load_float(src, dtype, state_offset(n, hv, r, v0 + c + 1, sn, sh, s2, s3, f.state_v_first)) : 0.f;
    });
  }
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_chunks) issue_loads(i, s.stage[i]);
    commit_async_copies();
  }
  int stage = 0;  // ci % kStages
  uint16_t* const states = grad ? a.dstates : a.states;
  for (int64_t ci = 0; ci < n_chunks; ++ci) {
    ChainStage& g = s.stage[stage];
    const int64_t c = chunk_at(ci);
    const int64_t t0 = seq.bos + c * kChunk;
    const int L = int(min64(kChunk, seq.eos - t0));
    for_each_pair(S, m0, 0, [&](int r, int col, float& x0, float& x1) { store_pair(st, r, col, x0, x1); });
    wait_async_copies_but<kStages - 2>();
    __syncthreads();  // chunk ci's stage and the state in; chunk ci − 1's reads done
    if (ci + kStages - 1 < n_chunks) issue_loads(ci + kStages - 1, s.stage[stage == 0 ? kStages - 1 : stage - 1]);
    commit_async_copies();
    {  // the state slice to the workspace, 16 bytes a thread and step
      uint16_t* const gs = states + (chunk_slot(n, c, seq.bos, f.T, varlen) * f.HV + hv) * kDim * kDim + v0;
      for (int i = tid; i < kDim * kVt / 8; i += kThreads) {
        const int r = i / (kVt / 8), v = 8 * (i % (kVt / 8));
        *reinterpret_cast<uint4*>(gs + r * kDim + v) = *reinterpret_cast<const uint4*>(st.at(r, v));
      }
    }
    const Tile k{g.k, kLdWide}, w{g.w, kLdWide}, q{g.q, kLdWide}, in{g.in, kLdVt}, dos{g.dos, kLdVt};
    if (grad) {  // diag(scale e^γ r_q) dO as hi + lo
      for (int i = tid; i < kChunk * kVt / 2; i += kThreads) {
        const int r = i / (kVt / 2), col = 2 * (i % (kVt / 2));
        const float sq = g.rows[r].y;  // zero past the chunk's end
        const float2 d = Mma::unpack(*reinterpret_cast<const uint32_t*>(dos.at(r, col)));
        const float x0 = sq * d.x, x1 = sq * d.y;
        const uint32_t hi = Mma::pack(x0, x1);
        const float2 h2 = Mma::unpack(hi);
        *reinterpret_cast<uint32_t*>(dhi.at(r, col)) = hi;
        store_pair(dlo, r, col, x0 - h2.x, x1 - h2.y);
      }
    }
    {  // the 64 x 32 chunk products K dS' or W S: rows 16 (warp % 4), columns 16 (warp / 4)
      float acc[1][2][4];
      zero(acc);
      const int pm = 16 * (warp % 4), pn = 16 * (warp / 4);
      const Tile lhs{grad ? g.k : g.w, kLdWide};
      warp_gemm<1, 2, false, false, kDim / 16>(acc, lhs, st, pm, pn, kDim);
      for_each_pair(acc, pm, pn, [&](int r, int col, float& x0, float& x1) {
        const float2 base = Mma::unpack(*reinterpret_cast<const uint32_t*>(in.at(r, col)));
        const float f0 = g.rows[r].x;  // e^{γ_L − γ} r_k, zero past the chunk's end
        if (grad) {  // −dVd = −(Z + b r_k K dS')
          store_pair(vd, r, col, -(base.x + f0 * x0), -(base.y + f0 * x1));
        } else {  // r_k b (U0 − W S)
          store_pair(vd, r, col, f0 * (base.x - x0), f0 * (base.y - x1));
        }
      });
    }
    __syncthreads();  // vd and the dO halves in
    const float el = g.rows[0].z;
    stage = stage == kStages - 1 ? 0 : stage + 1;
    for_each_pair(S, m0, 0, [&](int, int, float& x0, float& x1) {
      x0 *= el;
      x1 *= el;
    });
    if (grad) {
      warp_gemm<1, 4, true, false, kChunk / 16>(S, q, dhi, m0, 0, kChunk);
      warp_gemm<1, 4, true, false, kChunk / 16>(S, q, dlo, m0, 0, kChunk);
      warp_gemm<1, 4, true, false, kChunk / 16>(S, w, vd, m0, 0, kChunk);
    } else {
      warp_gemm<1, 4, true, false, kChunk / 16>(S, k, vd, m0, 0, kChunk);
    }
  }
  if (grad && a.dh0 != nullptr) {
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
