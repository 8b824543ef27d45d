#include "cuda/sm90/gdn_bwd_simple_sm90.h"

#include <algorithm>

#include "core/trace.h"
#include "cuda/sm90/device_common.cuh"

namespace flashqla::cuda {
namespace {

constexpr int kChunk = 64;     // tokens per chunk
constexpr int kThreads = 256;  // 8 warps
constexpr int kLdm = kChunk + 1;  // row stride of the 64x64 matrices (row sums read conflict-free)

// Chunk-start-state slot of chunk c of sequence n. Batch rows all have T
// tokens; packed sequences take floor(bos / 64) + n + c, which never collides
// (floor((b + l) / 64) + 1 >= floor(b / 64) + ceil(l / 64)) and stays below
// floor(T / 64) + N.
__device__ __forceinline__ int64_t chunk_slot(int64_t n, int64_t c, int64_t bos, int64_t T, bool varlen) {
  return varlen ? bos / kChunk + n + c : n * ((T + kChunk - 1) / kChunk) + c;
}

// Shared memory of one chain CTA (fp32). Rows of q/k and of the tiles are
// padded by one word so that threads reading different rows at the same column
// hit different banks.
template <int VT>
struct ChainTiles {
  static constexpr int ldt = VT + 1;
  float* q;      // [64][K + 1]  (l2-normalised when asked)
  float* k;      // [64][K + 1]
  float* S;      // [K][ldt]     chunk-start state slice
  float* dS;     // [K][ldt]     gradient of the state after the chunk, then before it
  float* u;      // [64][ldt]    v, then U = v − e^γ K S
  float* dos;    // [64][ldt]    scale · dO
  float* vd;     // [64][ldt]    Vd = (I + A)⁻¹ diag(β) U
  float* ks;     // [64][ldt]    K S, then dKS = −e^γ β dR
  float* qs;     // [64][ldt]    Q S, then dR = (I + A)⁻¹ᵀ dVd
  float* kds;    // [64][ldt]    K dS'
  float* dvd;    // [64][ldt]    dVd
  float* P;      // [64][kLdm]   Γ ⊙ Q Kᵀ (i ≥ j), then P ⊙ dP
  float* minv;   // [64][kLdm]   (I + A)⁻¹, then dA β Γ
  float* kkg;    // [64][kLdm]   Γ ⊙ K Kᵀ (i > j), then dA ⊙ Γ ⊙ K Kᵀ
  float* dqk;    // [64][kLdm]   Γ ⊙ dP
  float* gamma;  // [64] chunk-local cumsum of g (padded rows repeat the last)
  float* beta;   // [64] activated β (padded rows 0)
  float* eg;     // [64] e^γ
  float* b;      // [64] e^{γ_last − γ}
  float* dgam;   // [64] the tile's dγ
  float* dbet;   // [64] the tile's dβ
  float* xrow;   // [64] per-row terms of dγ_last
  float* red;    // [kThreads / 32] block reduction

  __device__ ChainTiles(float* smem, int64_t K) {
    const int64_t ldk = K + 1;
    q = smem;
    k = q + kChunk * ldk;
    S = k + kChunk * ldk;
    dS = S + K * ldt;
    u = dS + K * ldt;
    dos = u + kChunk * ldt;
    vd = dos + kChunk * ldt;
    ks = vd + kChunk * ldt;
    qs = ks + kChunk * ldt;
    kds = qs + kChunk * ldt;
    dvd = kds + kChunk * ldt;
    P = dvd + kChunk * ldt;
    minv = P + kChunk * kLdm;
    kkg = minv + kChunk * kLdm;
    dqk = kkg + kChunk * kLdm;
    gamma = dqk + kChunk * kLdm;
    beta = gamma + kChunk;
    eg = beta + kChunk;
    b = eg + kChunk;
    dgam = b + kChunk;
    dbet = dgam + kChunk;
    xrow = dbet + kChunk;
    red = xrow + kChunk;
  }
  static size_t bytes(int64_t K) {
    return sizeof(float) * (2 * kChunk * (K + 1) + 2 * K * ldt + 7 * kChunk * ldt + 4 * kChunk * kLdm + 7 * kChunk +
                            kThreads / 32);
  }
};

// One chain CTA's coordinates.
struct ChainItem {
  int64_t n, hv, h, v0, row, bos, eos;
  int bv;  // valid columns of the tile
};

template <int VT>
__device__ ChainItem chain_item(const BackwardArgs& a) {
  const ForwardArgs& f = a.f;
  ChainItem it;
  const int64_t tiles = a.v_tiles;
  it.v0 = (int64_t(blockIdx.x) % tiles) * VT;
  it.hv = (int64_t(blockIdx.x) / tiles) % f.HV;
  it.n = int64_t(blockIdx.x) / tiles / f.HV;
  it.h = it.hv / f.group;
  it.bv = int(min64(VT, f.V - it.v0));
  const SequenceRange seq = sequence_range(f.cu_seqlens, f.cu_seqlens_int64, f.T, it.n);
  it.row = seq.row, it.bos = seq.bos, it.eos = seq.eos;
  return it;
}

// Loads chunk [t0, t0 + L) of the item: q, k (normalised when asked), the v
// tile into u, scale · dO into dos (with_do), γ (cumsum), β (activated), e^γ
// and e^{γ_last − γ}. Rows >= L are zero (γ repeats its last value).
template <int VT>
__device__ void load_chunk(const ChainTiles<VT>& s, const BackwardArgs& a, const ChainItem& it, int64_t t0, int L,
                           bool with_do) {
  const ForwardArgs& f = a.f;
  const int64_t K = f.K, ldk = K + 1;
  const int tid = threadIdx.x;
  for (int64_t i = tid; i < kChunk * K; i += kThreads) {
    const int64_t r = i / K, x = i % K, t = t0 + r;
    const bool in = r < L;
    s.q[r * ldk + x] = in ? load_float(f.q, f.token_dtype, it.row * f.q_sb + t * f.q_st + it.h * f.q_sh + x) : 0.f;
    s.k[r * ldk + x] = in ? load_float(f.k, f.token_dtype, it.row * f.k_sb + t * f.k_st + it.h * f.k_sh + x) : 0.f;
  }
  for (int i = tid; i < kChunk * VT; i += kThreads) {
    const int r = i / VT, c = i % VT;
    const bool in = r < L && c < it.bv;
    const int64_t t = t0 + r, col = it.v0 + c;
    s.u[r * s.ldt + c] = in ? load_float(f.v, f.token_dtype, it.row * f.v_sb + t * f.v_st + it.hv * f.v_sh + col) : 0.f;
    if (with_do) {
      s.dos[r * s.ldt + c] =
          in ? f.scale * load_float(a.d_o, a.do_dtype, it.row * a.do_sb + t * a.do_st + it.hv * a.do_sh + col) : 0.f;
    }
  }
  if (tid < kChunk) {
    const bool in = tid < L;
    const int64_t t = t0 + tid;
    s.gamma[tid] = in ? load_float(f.g, f.g_dtype, it.row * f.g_sb + t * f.g_st + it.hv) : 0.f;
    s.beta[tid] = in ? activate_beta(load_float(f.beta, f.beta_dtype, it.row * f.beta_sb + t * f.beta_st + it.hv),
                                     f.beta_activation)
                     : 0.f;
  }
  __syncthreads();
  if (f.use_qk_l2norm) normalize_qk_rows_fp32<kThreads>(s.q, s.k, L, K, ldk);
  if (tid == 0) chunk_cumsum_serial<kChunk>(s.gamma, L);
  __syncthreads();
  if (tid < kChunk) {
    s.eg[tid] = expf(s.gamma[tid]);
    s.b[tid] = expf(s.gamma[L - 1] - s.gamma[tid]);
  }
}

// Γ ⊙ K Kᵀ (strictly lower, rows < L) into kkg and, with_p, Γ ⊙ Q Kᵀ (lower,
// diagonal included) into P; then (I + A)⁻¹, A = diag(β) kkg, into minv by
// rows (each row from the ones above it: 64 columns × 4 partial sums a row).
template <int VT>
__device__ void chunk_matrices(const ChainTiles<VT>& s, int64_t K, int L, bool with_p) {
  const int64_t ldk = K + 1;
  const int tid = threadIdx.x;
  for (int i = tid; i < kChunk * kChunk; i += kThreads) {
    const int r = i / kChunk, c = i % kChunk;
    float kk = 0.f, qk = 0.f;
    if (r < L && c <= r) {
      const float G = expf(s.gamma[r] - s.gamma[c]);
      if (c < r) {
        for (int64_t x = 0; x < K; ++x) kk += s.k[r * ldk + x] * s.k[c * ldk + x];
        kk *= G;
      }
      if (with_p) {
        for (int64_t x = 0; x < K; ++x) qk += s.q[r * ldk + x] * s.k[c * ldk + x];
        qk *= G;
      }
    }
    s.kkg[r * kLdm + c] = kk;
    if (with_p) s.P[r * kLdm + c] = qk;
    s.minv[r * kLdm + c] = r == c ? 1.f : 0.f;
  }
  __syncthreads();
  // X = (I + A)⁻¹: X[r][c] = −β_r Σ_{c ≤ m < r} kkg[r][m] X[m][c] for c < r.
  const int c = tid / 4, part = tid % 4;
  for (int r = 1; r < L; ++r) {
    float x = 0.f;
    if (c < r) {
      for (int m = c + part; m < r; m += 4) x += s.kkg[r * kLdm + m] * s.minv[m * kLdm + c];
    }
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    if (c < r && part == 0) s.minv[r * kLdm + c] = -s.beta[r] * x;
    __syncthreads();
  }
}

// ks = K S and, with_qs, qs = Q S; then u = v − e^γ K S (after a barrier).
template <int VT>
__device__ void state_products(const ChainTiles<VT>& s, int64_t K, bool with_qs) {
  const int64_t ldk = K + 1;
  const int tid = threadIdx.x;
  for (int i = tid; i < kChunk * VT; i += kThreads) {
    const int r = i / VT, c = i % VT;
    float ks = 0.f, qs = 0.f;
    for (int64_t x = 0; x < K; ++x) {
      const float sv = s.S[x * s.ldt + c];
      ks += s.k[r * ldk + x] * sv;
      if (with_qs) qs += s.q[r * ldk + x] * sv;
    }
    s.ks[r * s.ldt + c] = ks;
    if (with_qs) s.qs[r * s.ldt + c] = qs;
    s.u[r * s.ldt + c] -= s.eg[r] * ks;  // the element's own: no other thread reads u here
  }
  __syncthreads();
}

// vd = (I + A)⁻¹ diag(β) U.
template <int VT>
__device__ void value_delta(const ChainTiles<VT>& s) {
  for (int i = threadIdx.x; i < kChunk * VT; i += kThreads) {
    const int r = i / VT, c = i % VT;
    float acc = 0.f;
    for (int j = 0; j <= r; ++j) acc += s.minv[r * kLdm + j] * s.beta[j] * s.u[j * s.ldt + c];
    s.vd[r * s.ldt + c] = acc;
  }
}

__device__ __forceinline__ float block_sum(float x, float* red) {
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kThreads / 32; ++w) total += red[w];
  __syncthreads();
  return total;
}

template <int VT>
__global__ void __launch_bounds__(kThreads, 1) gdn_bwd_simple_chain_kernel(const BackwardArgs a) {
  extern __shared__ float smem[];
  const ForwardArgs& f = a.f;
  const int64_t K = f.K, V = f.V, HV = f.HV, ldk = K + 1;
  const ChainTiles<VT> s(smem, K);
  constexpr int ldt = ChainTiles<VT>::ldt;
  const int tid = threadIdx.x;
  const ChainItem it = chain_item<VT>(a);
  const bool varlen = f.cu_seqlens != nullptr;
  const int64_t n_chunks = (it.eos - it.bos + kChunk - 1) / kChunk;
  auto states_of = [&](int64_t c) {
    return a.chunk_states + (chunk_slot(it.n, c, it.bos, f.T, varlen) * HV + it.hv) * K * V + it.v0;
  };

  // --- forward: the state at every chunk start, into the workspace ------------------
  for (int64_t i = tid; i < K * VT; i += kThreads) {
    const int64_t x = i / VT, c = i % VT;
    s.S[x * ldt + c] = (f.h0 != nullptr && c < it.bv)
                           ? load_float(f.h0, f.h0_dtype, state_offset(it.n, it.hv, x, it.v0 + c, f.h0_sn, f.h0_sh,
                                                                       f.h0_s2, f.h0_s3, f.state_v_first))
                           : 0.f;
  }
  __syncthreads();
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int64_t t0 = it.bos + c * kChunk;
    const int L = int(min64(kChunk, it.eos - t0));
    float* const st = states_of(c);
    for (int64_t i = tid; i < K * VT; i += kThreads) {
      const int64_t x = i / VT, cc = i % VT;
      if (cc < it.bv) st[x * V + cc] = s.S[x * ldt + cc];
    }
    load_chunk(s, a, it, t0, L, false);
    chunk_matrices(s, K, L, false);
    state_products(s, K, false);
    value_delta(s);
    __syncthreads();
    // S' = e^{γ_L} S + Kᵀ diag(e^{γ_L − γ}) Vd (each thread its own elements)
    const float el = s.eg[L - 1];
    for (int64_t i = tid; i < K * VT; i += kThreads) {
      const int64_t x = i / VT, cc = i % VT;
      float acc = el * s.S[x * ldt + cc];
      for (int j = 0; j < L; ++j) acc += s.b[j] * s.k[j * ldk + x] * s.vd[j * ldt + cc];
      s.S[x * ldt + cc] = acc;
    }
    __syncthreads();
  }

  // --- backward: dS from the last chunk to the first ----------------------------------
  for (int64_t i = tid; i < K * VT; i += kThreads) {
    const int64_t x = i / VT, c = i % VT;
    s.dS[x * ldt + c] = (a.dht != nullptr && c < it.bv)
                            ? load_float(a.dht, a.dht_dtype, state_offset(it.n, it.hv, x, it.v0 + c, a.dht_sn,
                                                                          a.dht_sh, a.dht_s2, a.dht_s3, f.state_v_first))
                            : 0.f;
  }
  const int64_t W = 2 * K + 2;  // a partials row: dq, dk, dβ, dg
  for (int64_t c = n_chunks - 1; c >= 0; --c) {
    const int64_t t0 = it.bos + c * kChunk;
    const int L = int(min64(kChunk, it.eos - t0));
    const float* const st = states_of(c);
    for (int64_t i = tid; i < K * VT; i += kThreads) {
      const int64_t x = i / VT, cc = i % VT;
      s.S[x * ldt + cc] = cc < it.bv ? st[x * V + cc] : 0.f;
    }
    load_chunk(s, a, it, t0, L, true);  // its barriers also cover the state load
    // dγ_last gets e^{γ_L} <S, dS'> (the tile's share).
    float sds = 0.f;
    for (int64_t i = tid; i < K * VT; i += kThreads) {
      const int64_t x = i / VT, cc = i % VT;
      sds += s.S[x * ldt + cc] * s.dS[x * ldt + cc];
    }
    const float s_ds = block_sum(sds, s.red);
    chunk_matrices(s, K, L, true);
    state_products(s, K, true);
    // dγ_i = e^{γ_i} (Q S)_i · dOs_i (first term); vd; K dS'
    if (tid < kChunk) {
      float acc = 0.f;
      for (int cc = 0; cc < VT; ++cc) acc += s.qs[tid * ldt + cc] * s.dos[tid * ldt + cc];
      s.dgam[tid] = s.eg[tid] * acc;
    }
    value_delta(s);
    for (int i = tid; i < kChunk * VT; i += kThreads) {
      const int r = i / VT, cc = i % VT;
      float acc = 0.f;
      for (int64_t x = 0; x < K; ++x) acc += s.k[r * ldk + x] * s.dS[x * ldt + cc];
      s.kds[r * ldt + cc] = acc;
    }
    __syncthreads();
    // dVd = Pᵀ dOs + diag(e^{γ_L − γ}) K dS'
    for (int i = tid; i < kChunk * VT; i += kThreads) {
      const int j = i / VT, cc = i % VT;
      float acc = 0.f;
      for (int r = j; r < L; ++r) acc += s.P[r * kLdm + j] * s.dos[r * ldt + cc];
      s.dvd[j * ldt + cc] = acc + s.b[j] * s.kds[j * ldt + cc];
    }
    __syncthreads();
    // dR = (I + A)⁻¹ᵀ dVd (into qs, free now)
    for (int i = tid; i < kChunk * VT; i += kThreads) {
      const int j = i / VT, cc = i % VT;
      float acc = 0.f;
      for (int r = j; r < L; ++r) acc += s.minv[r * kLdm + j] * s.dvd[r * ldt + cc];
      s.qs[j * ldt + cc] = acc;
    }
    __syncthreads();
    float* const dR = s.qs;
    // The 64x64 gradients: dQK = Γ ⊙ dP (P: P ⊙ dP), dA (strict lower):
    // minv := dA β Γ, kkg := dA ⊙ Γ ⊙ K Kᵀ.
    for (int i = tid; i < kChunk * kChunk; i += kThreads) {
      const int r = i / kChunk, j = i % kChunk;
      float dqk = 0.f, pdp = 0.f, dab = 0.f, dak = 0.f;
      if (r < L && j <= r) {
        float dp = 0.f, da = 0.f;
        for (int cc = 0; cc < VT; ++cc) {
          dp += s.dos[r * ldt + cc] * s.vd[j * ldt + cc];
          da -= dR[r * ldt + cc] * s.vd[j * ldt + cc];
        }
        const float G = expf(s.gamma[r] - s.gamma[j]);
        dqk = G * dp;
        pdp = s.P[r * kLdm + j] * dp;
        if (j < r) {
          dab = da * s.beta[r] * G;
          dak = da * s.kkg[r * kLdm + j];
        }
      }
      s.dqk[r * kLdm + j] = dqk;
      s.P[r * kLdm + j] = j < r ? pdp : 0.f;  // the diagonal has no gate dependence
      s.minv[r * kLdm + j] = dab;
      s.kkg[r * kLdm + j] = dak;
    }
    __syncthreads();
    // dβ, dγ by rows: P ⊙ dP and β dA ⊙ A row sums minus column sums; U · dR;
    // K S · dKS; and x_j = e^{γ_L − γ_j} K dS'_j · Vd_j toward dγ_last.
    if (tid < kChunk) {
      const int t = tid;
      float dg = s.dgam[t], db = 0.f;
      for (int j = 0; j < t; ++j) {
        dg += s.P[t * kLdm + j] + s.beta[t] * s.kkg[t * kLdm + j];
        db += s.kkg[t * kLdm + j];
      }
      for (int i = t + 1; i < L; ++i) dg -= s.P[i * kLdm + t] + s.beta[i] * s.kkg[i * kLdm + t];
      float udr = 0.f, ksdr = 0.f, kdsvd = 0.f;
      for (int cc = 0; cc < VT; ++cc) {
        udr += s.u[t * ldt + cc] * dR[t * ldt + cc];
        ksdr += s.ks[t * ldt + cc] * dR[t * ldt + cc];
        kdsvd += s.kds[t * ldt + cc] * s.vd[t * ldt + cc];
      }
      db += udr;
      dg -= s.eg[t] * s.beta[t] * ksdr;
      const float xj = t < L - 1 ? s.b[t] * kdsvd : 0.f;
      dg -= xj;
      s.xrow[t] = xj;
      s.dgam[t] = dg;
      s.dbet[t] = db;
    }
    __syncthreads();
    // dKS = −e^γ β dR (into ks); dv = β dR.
    for (int i = tid; i < kChunk * VT; i += kThreads) {
      const int r = i / VT, cc = i % VT;
      const float du = s.beta[r] * dR[r * ldt + cc];
      s.ks[r * ldt + cc] = -s.eg[r] * du;
      if (r < L && cc < it.bv) {
        store_float(a.dv, a.dv_dtype, it.row * a.dv_sb + (t0 + r) * a.dv_st + it.hv * a.dv_sh + it.v0 + cc, du);
      }
    }
    if (tid == 0) {  // dγ_last, then the reverse in-chunk cumsum: dg_t = Σ_{i ≥ t} dγ_i
      float last = s.eg[L - 1] * s_ds;
      for (int j = 0; j < L - 1; ++j) last += s.xrow[j];
      s.dgam[L - 1] += last;
      float acc = 0.f;
      for (int r = L - 1; r >= 0; --r) s.dgam[r] = (acc += s.dgam[r]);
    }
    __syncthreads();
    // The tile's dq and dk rows, into the partials.
    float* const part = a.partials + ((int64_t(blockIdx.x) % a.v_tiles) * a.B * f.T) * HV * W;
    for (int64_t i = tid; i < int64_t(L) * K; i += kThreads) {
      const int r = int(i / K);
      const int64_t x = i % K;
      float dq = 0.f, dk = 0.f;
      float sdo = 0.f, dsvd = 0.f, sdks = 0.f;
      for (int cc = 0; cc < VT; ++cc) {
        const float sv = s.S[x * ldt + cc];
        sdo += sv * s.dos[r * ldt + cc];
        sdks += sv * s.ks[r * ldt + cc];
        dsvd += s.dS[x * ldt + cc] * s.vd[r * ldt + cc];
      }
      dq = s.eg[r] * sdo;
      for (int j = 0; j <= r; ++j) dq += s.dqk[r * kLdm + j] * s.k[j * ldk + x];
      dk = s.b[r] * dsvd + sdks;
      for (int i2 = r; i2 < L; ++i2) dk += s.dqk[i2 * kLdm + r] * s.q[i2 * ldk + x];
      for (int j = 0; j < r; ++j) dk += s.minv[r * kLdm + j] * s.k[j * ldk + x];
      for (int i2 = r + 1; i2 < L; ++i2) dk += s.minv[i2 * kLdm + r] * s.k[i2 * ldk + x];
      float* const row = part + ((it.row * f.T + t0 + r) * HV + it.hv) * W;
      row[x] = dq;
      row[K + x] = dk;
    }
    if (tid < L) {
      float* const row = part + ((it.row * f.T + t0 + tid) * HV + it.hv) * W;
      row[2 * K] = s.dbet[tid];
      row[2 * K + 1] = s.dgam[tid];
    }
    __syncthreads();
    // dS = e^{γ_L} dS' + Qᵀ diag(e^γ) dOs + Kᵀ dKS (each thread its own elements)
    const float el = s.eg[L - 1];
    for (int64_t i = tid; i < K * VT; i += kThreads) {
      const int64_t x = i / VT, cc = i % VT;
      float acc = el * s.dS[x * ldt + cc];
      for (int r = 0; r < L; ++r) {
        acc += s.q[r * ldk + x] * s.eg[r] * s.dos[r * ldt + cc] + s.k[r * ldk + x] * s.ks[r * ldt + cc];
      }
      s.dS[x * ldt + cc] = acc;
    }
    __syncthreads();
  }
  if (a.dh0 != nullptr) {
    for (int64_t i = tid; i < K * VT; i += kThreads) {
      const int64_t x = i / VT, c = i % VT;
      if (c < it.bv) {
        store_float(a.dh0, a.dh0_dtype,
                    state_offset(it.n, it.hv, x, it.v0 + c, a.dh0_sn, a.dh0_sh, a.dh0_s2, a.dh0_s3, f.state_v_first),
                    s.dS[x * ldt + c]);
      }
    }
  }
}

constexpr int kFinishWarps = 8;
constexpr int kMaxKPerLane = 256 / 32;

// y = x r, r = (Σx² + ε)^-½ over one row spread over a warp (lane + 32 e):
// dx = r (dy − y (y · dy)), in place of dy.
__device__ __forceinline__ void l2norm_backward(float (&d)[kMaxKPerLane], const void* src, flashqla_dtype_t dtype,
                                                int64_t base, int64_t K, int lane) {
  float xv[kMaxKPerLane];
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < kMaxKPerLane; ++e) {
    const int64_t x = lane + 32 * e;
    xv[e] = x < K ? load_float(src, dtype, base + x) : 0.f;
    ss += xv[e] * xv[e];
  }
  for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const float r = rsqrtf(ss + 1e-6f);
  float ydy = 0.f;
#pragma unroll
  for (int e = 0; e < kMaxKPerLane; ++e) ydy += xv[e] * r * d[e];
  for (int off = 16; off > 0; off /= 2) ydy += __shfl_xor_sync(0xffffffffu, ydy, off);
#pragma unroll
  for (int e = 0; e < kMaxKPerLane; ++e) d[e] = r * (d[e] - xv[e] * r * ydy);
}

// One warp a (batch row, token, q/k head): dq and dk summed over the V tiles
// and the head's value heads, through the l2norm backward when asked; the
// lanes then take the group's value heads for dβ (through the activation) and
// dg.
__global__ void __launch_bounds__(kFinishWarps * 32) gdn_bwd_simple_finish_kernel(const BackwardArgs a) {
  const ForwardArgs& f = a.f;
  const int64_t K = f.K, HV = f.HV, W = 2 * K + 2;
  const int lane = threadIdx.x % 32;
  const int64_t item = int64_t(blockIdx.x) * kFinishWarps + threadIdx.x / 32;
  if (item >= a.B * f.T * f.H) return;
  const int64_t h = item % f.H, bt = item / f.H, row = bt / f.T, t = bt % f.T;
  const int64_t tile_stride = a.B * f.T * HV * W;
  float dq[kMaxKPerLane], dk[kMaxKPerLane];
#pragma unroll
  for (int e = 0; e < kMaxKPerLane; ++e) {
    dq[e] = dk[e] = 0.f;
    const int64_t x = lane + 32 * e;
    if (x >= K) continue;
    for (int64_t hv = h * f.group; hv < (h + 1) * f.group; ++hv) {
      const float* p = a.partials + (bt * HV + hv) * W;
      for (int64_t tile = 0; tile < a.v_tiles; ++tile, p += tile_stride) {
        dq[e] += p[x];
        dk[e] += p[K + x];
      }
    }
  }
  if (f.use_qk_l2norm) {
    l2norm_backward(dq, f.q, f.token_dtype, row * f.q_sb + t * f.q_st + h * f.q_sh, K, lane);
    l2norm_backward(dk, f.k, f.token_dtype, row * f.k_sb + t * f.k_st + h * f.k_sh, K, lane);
  }
#pragma unroll
  for (int e = 0; e < kMaxKPerLane; ++e) {
    const int64_t x = lane + 32 * e;
    if (x >= K) continue;
    store_float(a.dq, a.dq_dtype, row * a.dq_sb + t * a.dq_st + h * a.dq_sh + x, dq[e]);
    store_float(a.dk, a.dk_dtype, row * a.dk_sb + t * a.dk_st + h * a.dk_sh + x, dk[e]);
  }
  for (int64_t hv = h * f.group + lane; hv < (h + 1) * f.group; hv += 32) {
    float db = 0.f, dg = 0.f;
    const float* p = a.partials + (bt * HV + hv) * W;
    for (int64_t tile = 0; tile < a.v_tiles; ++tile, p += tile_stride) {
      db += p[2 * K];
      dg += p[2 * K + 1];
    }
    const float raw = load_float(f.beta, f.beta_dtype, row * f.beta_sb + t * f.beta_st + hv);
    if (f.beta_activation != FLASHQLA_BETA_IDENTITY) {
      db *= activate_beta_grad(raw, f.beta_activation);
    }
    store_float(a.dbeta, a.dbeta_dtype, row * a.dbeta_sb + t * a.dbeta_st + hv, db);
    store_float(a.dg, a.dg_dtype, row * a.dg_sb + t * a.dg_st + hv, dg);
  }
}

template <int VT>
cudaError_t launch_chain(const BackwardArgs& args, cudaStream_t stream) {
  const size_t smem = ChainTiles<VT>::bytes(args.f.K);
  cudaError_t err = cudaFuncSetAttribute(gdn_bwd_simple_chain_kernel<VT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const int64_t blocks = args.v_tiles * args.f.HV * args.f.N;
  if (blocks == 0) return cudaSuccess;
  FLASHQLA_PLAN("gdn_bwd_simple_chain_kernel: grid=%lld block=%d smem=%zu bytes (V tile %d)", (long long)blocks,
                kThreads, smem, VT);
  gdn_bwd_simple_chain_kernel<VT><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

SimpleBackwardLayout simple_backward_layout(int64_t B, int64_t T, int64_t N, int64_t HV, int64_t K, int64_t V,
                                            bool varlen, size_t offset, size_t max_smem_bytes) {
  SimpleBackwardLayout l;
  for (int vt : {32, 16, 8, 4}) {
    const size_t smem = vt == 32 ? ChainTiles<32>::bytes(K)
                        : vt == 16 ? ChainTiles<16>::bytes(K)
                        : vt == 8  ? ChainTiles<8>::bytes(K)
                                   : ChainTiles<4>::bytes(K);
    l.v_tile = vt;
    if (smem <= max_smem_bytes) break;
  }
  l.v_tiles = (V + l.v_tile - 1) / l.v_tile;
  l.chunk_slots = varlen ? T / kChunk + N : N * ((T + kChunk - 1) / kChunk);
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  l.states = align(offset);
  l.partials = align(l.states + sizeof(float) * size_t(l.chunk_slots) * HV * K * V);
  l.bytes = l.partials + sizeof(float) * size_t(l.v_tiles) * B * T * HV * (2 * K + 2);
  return l;
}

cudaError_t launch_gdn_bwd_simple(const BackwardArgs& args, int v_tile, cudaStream_t stream) {
  cudaError_t err = v_tile == 32   ? launch_chain<32>(args, stream)
                    : v_tile == 16 ? launch_chain<16>(args, stream)
                    : v_tile == 8  ? launch_chain<8>(args, stream)
                                   : launch_chain<4>(args, stream);
  if (err != cudaSuccess) return err;
  const int64_t warps = args.B * args.f.T * args.f.H;
  if (warps == 0) return cudaSuccess;
  const int64_t blocks = (warps + kFinishWarps - 1) / kFinishWarps;
  gdn_bwd_simple_finish_kernel<<<static_cast<unsigned>(blocks), kFinishWarps * 32, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
