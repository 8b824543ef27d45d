#include "cuda/sm90/gdn_fwd_simple_sm90.h"

#include "core/trace.h"
#include "cuda/sm90/device_common.cuh"
#include "cuda/sm90/work_scheduler.cuh"

namespace flashqla::cuda {
namespace {

constexpr int kChunk = 64;     // tokens per chunk
constexpr int kTileV = 32;     // value columns per CTA
constexpr int kThreads = 256;  // 8 warps
// Each thread owns the same (row, column) elements of every chunk-sized tile.
constexpr int kElemsPerThread = kChunk * kTileV / kThreads;
static_assert(kChunk * kTileV % kThreads == 0, "chunk tile must split evenly over the threads");
static_assert(kTileV == 32, "a warp spans one row of a V tile (conflict-free state reads)");

// Shared-memory tiles of one CTA (fp32). Rows of q/k are padded by one word so
// that threads reading different rows at the same column hit different banks.
struct Tiles {
  float* S;      // [K][kTileV]       state slice
  float* q;      // [kChunk][K + 1]
  float* k;      // [kChunk][K + 1]
  float* u;      // [kChunk][kTileV]  v, then U = v − e^γ K S
  float* vd;     // [kChunk][kTileV]  Vd
  float* a;      // [kChunk][kChunk]  A (gated, strictly lower), then P = Γ ⊙ Q Kᵀ
  float* minv;   // [kChunk][kChunk]  (I + A)⁻¹
  float* gamma;  // [kChunk]          chunk-local cumsum of g
  float* beta;   // [kChunk]

  __device__ Tiles(float* smem, int64_t K) {
    S = smem;
    q = S + K * kTileV;
    k = q + kChunk * (K + 1);
    u = k + kChunk * (K + 1);
    vd = u + kChunk * kTileV;
    a = vd + kChunk * kTileV;
    minv = a + kChunk * kChunk;
    gamma = minv + kChunk * kChunk;
    beta = gamma + kChunk;
  }
  static size_t bytes(int64_t K) {
    return sizeof(float) * (K * kTileV + 2 * kChunk * (K + 1) + 2 * kChunk * kTileV +
                            2 * kChunk * kChunk + 2 * kChunk);
  }
};

__global__ void __launch_bounds__(kThreads) gdn_fwd_simple_kernel(const ForwardArgs a) {
  extern __shared__ float smem[];
  const int64_t K = a.K, ldk = K + 1;
  Tiles s(smem, K);
  const int tid = threadIdx.x;
  // blockIdx.x enumerates (sequence, value head, V tile), V tile fastest.
  const int64_t tiles = (a.V + kTileV - 1) / kTileV;
  const int64_t v0 = (int64_t(blockIdx.x) % tiles) * kTileV;
  const int64_t hv = (int64_t(blockIdx.x) / tiles) % a.HV, n = int64_t(blockIdx.x) / tiles / a.HV;
  const int64_t h = hv / a.group;
  const int bv = int(min64(kTileV, a.V - v0));

  const SequenceRange seq = sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, n);
  const int64_t row = seq.row, bos = seq.bos, eos = seq.eos;
  const int64_t srow = state_row(a.state_indices, a.state_indices_int64, a.pool_slots, n);  // -1: none

  for (int64_t i = tid; i < K * kTileV; i += kThreads) {
    const int64_t x = i / kTileV, c = i % kTileV;
    s.S[i] = (a.h0 != nullptr && srow >= 0 && c < bv)
                 ? load_float(a.h0, a.h0_dtype,
                              state_offset(srow, hv, x, v0 + c, a.h0_sn, a.h0_sh, a.h0_s2, a.h0_s3, a.state_v_first))
                 : 0.f;
  }

  for (int64_t t0 = bos; t0 < eos; t0 += kChunk) {
    const int L = int(min64(kChunk, eos - t0));
    // --- load the chunk (rows >= L are zero) ------------------------------------
    for (int64_t i = tid; i < kChunk * K; i += kThreads) {
      const int64_t r = i / K, x = i % K;
      const bool in = r < L;
      const int64_t t = t0 + r;
      s.q[r * ldk + x] = in ? load_float(a.q, a.token_dtype, row * a.q_sb + t * a.q_st + h * a.q_sh + x) : 0.f;
      s.k[r * ldk + x] = in ? load_float(a.k, a.token_dtype, row * a.k_sb + t * a.k_st + h * a.k_sh + x) : 0.f;
    }
    for (int i = tid; i < kChunk * kTileV; i += kThreads) {
      const int r = i / kTileV, c = i % kTileV;
      s.u[i] = (r < L && c < bv)
                   ? load_float(a.v, a.token_dtype, row * a.v_sb + (t0 + r) * a.v_st + hv * a.v_sh + v0 + c)
                   : 0.f;
    }
    if (tid < kChunk) {
      const bool in = tid < L;
      s.gamma[tid] = in ? load_float(a.g, a.g_dtype, row * a.g_sb + (t0 + tid) * a.g_st + hv) : 0.f;
      s.beta[tid] = in ? activate_beta(load_float(a.beta, a.beta_dtype, row * a.beta_sb + (t0 + tid) * a.beta_st + hv),
                                       a.beta_activation)
                       : 0.f;
    }
    __syncthreads();
    if (a.use_qk_l2norm) normalize_qk_rows_fp32<kThreads>(s.q, s.k, L, K, ldk);
    if (tid == 0) chunk_cumsum_serial<kChunk>(s.gamma, L);
    __syncthreads();

    // --- A = StrictLower(diag(β) (K Kᵀ ⊙ Γ)) ------------------------------------
    for (int i = tid; i < kChunk * kChunk; i += kThreads) {
      const int r = i / kChunk, c = i % kChunk;
      float acc = 0.f;
      if (c < r && r < L) {
        for (int64_t x = 0; x < K; ++x) acc += s.k[r * ldk + x] * s.k[c * ldk + x];
        acc *= s.beta[r] * __expf(s.gamma[r] - s.gamma[c]);
      }
      s.a[i] = acc;
    }
    __syncthreads();
    // --- (I + A)⁻¹ by forward substitution, one thread per column ---------------
    if (tid < kChunk) {
      const int c = tid;
      for (int r = 0; r < kChunk; ++r) {
        float x = r == c ? 1.f : 0.f;
        if (r > c) {
          for (int m = c; m < r; ++m) x -= s.a[r * kChunk + m] * s.minv[m * kChunk + c];
        }
        s.minv[r * kChunk + c] = x;
      }
    }
    __syncthreads();
    // --- P = Γ ⊙ Q Kᵀ (lower, diagonal included), into A's tile ------------------
    for (int i = tid; i < kChunk * kChunk; i += kThreads) {
      const int r = i / kChunk, c = i % kChunk;
      float acc = 0.f;
      if (c <= r && r < L) {
        for (int64_t x = 0; x < K; ++x) acc += s.q[r * ldk + x] * s.k[c * ldk + x];
        acc *= __expf(s.gamma[r] - s.gamma[c]);
      }
      s.a[i] = acc;
    }
    // --- U = V − e^γ K S, and e^γ Q S kept in registers for O ----------------------
    float qs[kElemsPerThread];
#pragma unroll
    for (int e = 0; e < kElemsPerThread; ++e) {
      const int i = tid + e * kThreads, r = i / kTileV, c = i % kTileV;
      float ks_acc = 0.f, qs_acc = 0.f;
      for (int64_t x = 0; x < K; ++x) {
        const float sv = s.S[x * kTileV + c];
        ks_acc += s.k[r * ldk + x] * sv;
        qs_acc += s.q[r * ldk + x] * sv;
      }
      const float eg = __expf(s.gamma[r]);
      s.u[i] -= eg * ks_acc;
      qs[e] = eg * qs_acc;
    }
    __syncthreads();
    // --- Vd = (I + A)⁻¹ diag(β) U -------------------------------------------------
#pragma unroll
    for (int e = 0; e < kElemsPerThread; ++e) {
      const int i = tid + e * kThreads, r = i / kTileV, c = i % kTileV;
      float acc = 0.f;
      for (int j = 0; j <= r; ++j) acc += s.minv[r * kChunk + j] * s.beta[j] * s.u[j * kTileV + c];
      s.vd[i] = acc;
    }
    __syncthreads();
    // --- O = scale (e^γ Q S + P Vd) ---------------------------------------------
#pragma unroll
    for (int e = 0; e < kElemsPerThread; ++e) {
      const int i = tid + e * kThreads, r = i / kTileV, c = i % kTileV;
      if (r >= L || c >= bv) continue;
      float acc = qs[e];
      for (int j = 0; j <= r; ++j) acc += s.a[r * kChunk + j] * s.vd[j * kTileV + c];
      store_float(a.o, a.o_dtype, row * a.o_sb + (t0 + r) * a.o_st + hv * a.o_sh + v0 + c, a.scale * acc);
    }
    // --- S' = e^{γ_L} S + Kᵀ diag(e^{γ_L − γ}) Vd ----------------------------------
    const float gl = s.gamma[L - 1];
    const float el = __expf(gl);
    for (int64_t i = tid; i < K * kTileV; i += kThreads) {
      const int64_t x = i / kTileV, c = i % kTileV;
      float acc = el * s.S[i];
      for (int j = 0; j < L; ++j) acc += __expf(gl - s.gamma[j]) * s.k[j * ldk + x] * s.vd[j * kTileV + c];
      s.S[i] = acc;
    }
    __syncthreads();
    // A checkpoint after every ckpt_chunks whole chunks of the sequence.
    const int64_t done = (t0 - bos) / kChunk + 1;
    if (a.ckpt != nullptr && L == kChunk && done % a.ckpt_chunks == 0) {
      const StateTarget t = user_checkpoints(a, n, hv);
      const int64_t base = t.base + (done / a.ckpt_chunks - 1) * a.ckpt_sn;
      for (int64_t i = tid; i < K * kTileV; i += kThreads) {
        const int64_t x = i / kTileV, c = i % kTileV;
        if (c < bv) store_float(t.ptr, t.dtype, base + x * t.sx + (v0 + c) * t.sc, s.S[i]);
      }
    }
  }

  if (a.ht != nullptr && srow >= 0) {
    for (int64_t i = tid; i < K * kTileV; i += kThreads) {
      const int64_t x = i / kTileV, c = i % kTileV;
      if (c < bv) {
        store_float(a.ht, a.ht_dtype,
                    state_offset(srow, hv, x, v0 + c, a.ht_sn, a.ht_sh, a.ht_s2, a.ht_s3, a.state_v_first), s.S[i]);
      }
    }
  }
}

}  // namespace

cudaError_t launch_gdn_fwd_simple(const ForwardArgs& args, cudaStream_t stream) {
  const size_t smem = Tiles::bytes(args.K);
  cudaError_t err = cudaFuncSetAttribute(gdn_fwd_simple_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const int64_t blocks = (args.V + kTileV - 1) / kTileV * args.HV * args.N;
  if (blocks == 0) return cudaSuccess;
  FLASHQLA_PLAN("gdn_fwd_simple_kernel: grid=%lld block=%d smem=%zu bytes (V tile %d, chunk %d)",
                (long long)blocks, kThreads, smem, kTileV, kChunk);
  gdn_fwd_simple_kernel<<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
