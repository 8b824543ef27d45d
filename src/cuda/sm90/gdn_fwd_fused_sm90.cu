#include "cuda/sm90/gdn_fwd_fused_sm90.h"

#include "core/trace.h"
#include "cuda/fused_forward_support.h"
#include "cuda/sm90/device_common.cuh"
#include "cuda/sm90/forward_work_item.cuh"
#include "cuda/sm90/tma_load.cuh"
#include "cuda/sm90/token_tensor_map.h"
#include "cuda/sm90/warp_mma.cuh"
#include "cuda/sm90/warpgroup_mma.cuh"

namespace flashqla::cuda {
namespace {


constexpr int kChunk = 64;  // tokens per chunk
constexpr int kDim = 128;   // K = V
// Warpgroups 0 and 1 run the state chain of chunk c; warpgroup 2 loads chunk
// c + 1 and computes its A, T = (I + A)⁻¹, Tβ and P meanwhile (the
// state-independent part but U and W). Registers move to the state warpgroups.
constexpr int kStateThreads = 256;
constexpr int kProducerThreads = 128;
constexpr int kThreads = kStateThreads + kProducerThreads;
constexpr int kStateRegisters = 184, kProducerRegisters = 128;
// setmaxnreg.inc takes registers only from those the CTA's own .dec released
// (it waits otherwise: a deadlock), from the launch allocation (the register
// file over the CTA's threads, rounded down to 8: 168).
constexpr int kLaunchRegisters = (65536 / kThreads) & ~7;
static_assert(kStateThreads * (kStateRegisters - kLaunchRegisters) <=
                  kProducerThreads * (kLaunchRegisters - kProducerRegisters),
              "the state warpgroups' registers come from the producer's");
constexpr int kLdF = kChunk + 4;  // row stride of fp32 [64][64] tiles

// Named barriers (0 is __syncthreads): inside the state warpgroups, inside the
// producer warpgroup, chunk ready (producer -> state, per stage) and stage free
// (state -> producer, per stage).
constexpr int kBarState = 1, kBarProducer = 2, kBarChunkReady = 3, kBarStageFree = 5;

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
template <int kRegisters>
__device__ __forceinline__ void set_max_registers() {
  if constexpr (kRegisters > 168) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  }
}

// Shared memory (bytes). Three stages of k (the producer loads chunk c + 1's
// while it works on c and the state warpgroups on c − 1), two of q, v, P, Tβ
// and the gates (the chunk the producer hands over and the one the state
// warpgroups run); one of everything else. Every 16-bit tile is a core-matrix
// tile (ldmatrix reads it without bank conflicts, wgmma through a descriptor).
// T is the producer's own padded fp32 [64][68] tile: it builds T there in place
// from A's two 32x32 diagonal blocks, and keeps A's block below them (then
// M = T_11 A_10) in the block above, which T does not use.
using mma::CoreTile;
constexpr int kKStages = 3;
constexpr int kTile16 = kChunk * kDim * 2;   // [64][128]
constexpr int kTile64 = kChunk * kChunk * 2;  // [64][64]
constexpr int kTileF = kChunk * kLdF * 4;    // fp32 [64][68]
constexpr int kOffQ = 0;
constexpr int kOffK = kOffQ + 2 * kTile16;
constexpr int kOffV = kOffK + kKStages * kTile16;
constexpr int kOffW = kOffV + 2 * kTile16;
constexpr int kOffS = kOffW + kTile16;
constexpr int kOffVd = kOffS + kDim * kDim * 2;
constexpr int kOffP = kOffVd + kTile16;
constexpr int kOffTb = kOffP + 2 * kTile64;
constexpr int kOffT = kOffTb + 2 * kTile64;
constexpr int kOffGate = kOffT + kTileF;
constexpr int kGateFloats = 7 * kChunk;  // γ, e^γ, e^{γ_C − γ} two stages each, β one
constexpr int kOffBar = kOffGate + kGateFloats * 4;  // mbarriers: k stages, then q/v stages
constexpr int kSmemBytes = kOffBar + (kKStages + 2) * 8;
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
static_assert((kMaxRankedSequences + 1) * 8 <= kTileF, "the ranking scratch fits in T's tile");

// Isolation for kernel development (with FLASHQLA_FUSED_PROFILE only): build
// with -DFLASHQLA_FUSED_ISOLATE=1 and the producer does its work for the first
// two chunks only, then just hands stages over (the state warpgroups' standalone
// cost); =2 and the state warpgroups only release stages (the producer's). The
// results are garbage; the timings are what it is for.
#if defined(FLASHQLA_FUSED_ISOLATE) && !defined(FLASHQLA_FUSED_PROFILE)
#error "FLASHQLA_FUSED_ISOLATE is a profiling mode: it needs FLASHQLA_FUSED_PROFILE"
#endif

// Phase timing for kernel development: build with -DFLASHQLA_FUSED_PROFILE
// (benchmarks/tools/fused_phase_profile.cu). Every thread adds the cycles
// between its phase marks in registers; at the end CTA 0's first state thread
// and first producer thread add theirs to fused_profile_cycles (state phases
// 0..2 and 4..7, producer phases 3, 8..15, the chunk count in 16), which the tool reads
// back (no printf: a call in the kernel would serialize its wgmma pipeline).
#ifdef FLASHQLA_FUSED_PROFILE
constexpr int kProfileSlots = 17;
__device__ long long fused_profile_cycles[kProfileSlots];
#define FUSED_PHASE(i)                    \
  do {                                    \
    const long long now_ = clock64();     \
    profile[i] += now_ - phase_start;     \
    phase_start = now_;                   \
  } while (0)
#define FUSED_PROFILE_BEGIN() \
  long long profile[kProfileSlots] = {}, phase_start = clock64()
#define FUSED_PROFILE_END(n)                                                              \
  do {                                                                                    \
    if (blockIdx.x == 0 && (threadIdx.x == 0 || threadIdx.x == kStateThreads)) {          \
      for (int i_ = 0; i_ < kProfileSlots - 1; ++i_) fused_profile_cycles[i_] += profile[i_]; \
      if (threadIdx.x == 0) fused_profile_cycles[kProfileSlots - 1] += (n);               \
    }                                                                                     \
  } while (0)
#else
#define FUSED_PHASE(i) \
  do {                 \
  } while (0)
#define FUSED_PROFILE_BEGIN() \
  do {                        \
  } while (0)
#define FUSED_PROFILE_END(n) \
  do {                       \
  } while (0)
#endif

// e^x where keep, else 0, without a branch: the exponent is selected (−∞
// where masked), so masked entries never overflow and the epilogues over the
// accumulators stay straight-line code.
__device__ __forceinline__ float masked_exp(bool keep, float x) { return __expf(keep ? x : -INFINITY); }

// The tensor maps of q, k and v (tma_load.cuh), a kernel parameter.
struct TokenMaps {
  CUtensorMap q, k, v;
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_fwd_fused_kernel(const ForwardArgs a, const __grid_constant__ TokenMaps maps) {
  using M = mma::Mma<T>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* const sm_q = reinterpret_cast<T*>(smem + kOffQ);
  T* const sm_k = reinterpret_cast<T*>(smem + kOffK);
  T* const sm_v = reinterpret_cast<T*>(smem + kOffV);
  const CoreTile<T, kDim> w_tile{reinterpret_cast<T*>(smem + kOffW)};  // −W, [64 tokens][128 keys]
  // B operands read MN-major (rows = the reduction, columns = values): S's copy
  // [128 keys][128 values], Vd [64 tokens][128 values].
  const CoreTile<T, kDim> s_copy{reinterpret_cast<T*>(smem + kOffS)};
  const CoreTile<T, kDim> vd_tile{reinterpret_cast<T*>(smem + kOffVd)};
  // Handed over by the producer, two stages each: P = Q Kᵀ ⊙ Γ and Tβ = T diag(β),
  // [64][64] (A operands, K-major).
  auto p_tile = [&](int stage) { return CoreTile<T, kChunk>{reinterpret_cast<T*>(smem + kOffP + stage * kTile64)}; };
  auto tb_tile = [&](int stage) { return CoreTile<T, kChunk>{reinterpret_cast<T*>(smem + kOffTb + stage * kTile64)}; };
  float* const sm_t = reinterpret_cast<float*>(smem + kOffT);  // T, [64][kLdF] (producer)
  // Per-token gate vectors of a chunk, written by the producer's warp 0: γ (the
  // in-chunk cumsum of g), e^γ and e^{γ_C − γ} (γ_C: the chunk's last γ), two
  // stages each for the state warpgroups; β, one stage, for the producer only.
  float* const sm_gamma = reinterpret_cast<float*>(smem + kOffGate);  // [2][64]
  float* const sm_exp_gamma = sm_gamma + 2 * kChunk;                  // [2][64]
  float* const sm_decay = sm_exp_gamma + 2 * kChunk;                  // [2][64]
  float* const sm_beta = sm_decay + 2 * kChunk;                       // [64]

  // The warp index through a shuffle: ptxas then knows it is warp-uniform, and
  // branches on it do not serialize the wgmma pipeline (C7520).
  const int tid = threadIdx.x, warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;

  static_assert(kWorkItemChunk == kChunk, "work items count chunks of the kernel's size");
  const WorkItem item = resolve_work_item(a, blockIdx.x, reinterpret_cast<int64_t*>(smem + kOffT));
  if (!item.valid) return;
  const int64_t hv = item.hv, h = hv / a.group;
  // Token indices in 32 bits (fused_forward_supports: T < 2^31, as TMA's
  // coordinates are), which also keeps them in one register each.
  const int64_t row = item.seq.row;
  const int eos = int(item.seq.eos);
  const int bos = int(item.seq.bos + item.chunk_begin * kChunk);  // the item's first token
  const int64_t n_chunks = __shfl_sync(0xffffffffu, item.chunk_end - item.chunk_begin, 0);
  // q, k and v tiles land from TMA column block outermost.
  auto stage_tile = [&](T* tiles, int stage) { return mma::ColumnBlockTile<T, kChunk>{tiles + stage * kChunk * kDim}; };
  auto k_tile = [&](int64_t c) { return stage_tile(sm_k, int(c % kKStages)); };
  auto chunk_rows = [&](int64_t c) { return int(min64(kChunk, int64_t(eos - bos) - c * kChunk)); };

  // The loads' completion: one barrier a k stage, one a q/v stage.
  uint64_t* const bar_k = reinterpret_cast<uint64_t*>(smem + kOffBar);
  uint64_t* const bar_qv = bar_k + kKStages;
  if (tid == 0) {
    for (int i = 0; i < kKStages + 2; ++i) tma::barrier_init(bar_k + i, 1);
    tma::fence_barrier_init();
  }
  __syncthreads();


  if (warp >= kStateThreads / 32) {
    // ===== Producer warpgroup: loads, gates, A and T of each chunk, one ahead. =====
    set_max_registers<kProducerRegisters>();
    const int pwarp = warp - kStateThreads / 32;
#if defined(FLASHQLA_FUSED_ISOLATE) && FLASHQLA_FUSED_ISOLATE == 1
    constexpr int64_t kLoadedChunks = 2;  // the producer works on these only
#else
    constexpr int64_t kLoadedChunks = INT64_MAX;
#endif
    // One thread issues the loads (TMA: the whole tile in one instruction,
    // nothing in the load unit's queues), every producer thread waits for them
    // on the stage's barrier. Chunk c's k stage is c % 3 (its (c / 3)-th use),
    // its q/v stage c % 2 (its (c / 2)-th use).
    const bool loader = tid == kStateThreads;
    const int head_qk = int(h), head_v = int(hv), brow = int(row);
    auto load_k = [&](int64_t c) {
      uint64_t* const bar = bar_k + c % kKStages;
      tma::arrive_expect_bytes(bar, kTile16);
      tma::load_token_tile(k_tile(c).base, &maps.k, bar, int(bos + c * kChunk), head_qk, brow);
    };
    auto load_qv = [&](int64_t c, int stage) {
      uint64_t* const bar = bar_qv + stage;
      tma::arrive_expect_bytes(bar, item.read_v ? 2 * kTile16 : kTile16);
      tma::load_token_tile(stage_tile(sm_q, stage).base, &maps.q, bar, int(bos + c * kChunk), head_qk, brow);
      if (item.read_v)
        tma::load_token_tile(stage_tile(sm_v, stage).base, &maps.v, bar, int(bos + c * kChunk), head_v, brow);
    };
    // Rows of a landed tile (warp: row blocks w and w + 4; lane: row lane % 8,
    // 16-byte segments lane / 8 + 4 s of it, conflict-free): rows >= L zeroed
    // (past a packed sequence's end they hold the next sequence's tokens), the
    // others scaled to x · rsqrt(Σx² + 1e-6) where normalize.
    auto prepare_rows = [&](mma::ColumnBlockTile<T, kChunk> tile, int L, bool normalize) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = (pwarp + 4 * half) * 8 + (lane & 7);
        uint4* seg[4];
#pragma unroll
        for (int s4 = 0; s4 < 4; ++s4) seg[s4] = reinterpret_cast<uint4*>(tile.at(r, 8 * ((lane >> 3) + 4 * s4)));
        if (r >= L) {
#pragma unroll
          for (int s4 = 0; s4 < 4; ++s4) *seg[s4] = make_uint4(0u, 0u, 0u, 0u);
        }
        if (!normalize) continue;
        uint4 raw[4];
        float ss = 0.f;
#pragma unroll
        for (int s4 = 0; s4 < 4; ++s4) {
          raw[s4] = *seg[s4];
          const T* e = reinterpret_cast<const T*>(&raw[s4]);
#pragma unroll
          for (int i = 0; i < 8; ++i) ss += float(e[i]) * float(e[i]);
        }
        ss += __shfl_xor_sync(0xffffffffu, ss, 8);
        ss += __shfl_xor_sync(0xffffffffu, ss, 16);
        const float rs = rsqrtf(ss + 1e-6f);
#pragma unroll
        for (int s4 = 0; s4 < 4; ++s4) {
          T* e = reinterpret_cast<T*>(&raw[s4]);
#pragma unroll
          for (int i = 0; i < 8; ++i) e[i] = T(float(e[i]) * rs);
          *seg[s4] = raw[s4];
        }
      }
    };
    // Gates of a chunk as raw bits (warp 0, rows 2 lane and 2 lane + 1; rows
    // past the end read a valid row and are zeroed where converted), loaded
    // one chunk ahead so their latency hides behind A and T: converted only
    // where used (a conversion next to the load would stall the warp for the
    // global load's latency).
    auto load_gates = [&](int64_t c, uint32_t (&gr)[2], uint32_t (&br)[2]) {
      const int64_t tc = int64_t(bos) + c * kChunk;
      const int Lc = chunk_rows(c);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int r = 2 * lane + j;
        const int64_t t = tc + (r < Lc ? r : 0);
        gr[j] = load_raw(a.g, a.g_dtype, row * a.g_sb + t * a.g_st + hv);
        br[j] = load_raw(a.beta, a.beta_dtype, row * a.beta_sb + t * a.beta_st + hv);
      }
    };
    uint32_t g_next[2] = {}, b_next[2] = {};
    if (pwarp == 0 && n_chunks > 0) load_gates(0, g_next, b_next);
    if (!item.read_v) {  // v = 0 (a piece's transition): both v stages zeroed once, never loaded
      for (int i = tid - kStateThreads; i < 2 * kTile16 / 16; i += kProducerThreads)
        reinterpret_cast<uint4*>(sm_v)[i] = make_uint4(0u, 0u, 0u, 0u);
      wgmma::fence_shared_for_async();
    }
    if (loader && n_chunks > 0) {
      tma::prefetch_map(&maps.q);
      tma::prefetch_map(&maps.k);
      tma::prefetch_map(&maps.v);
      load_k(0);
    }
    FUSED_PROFILE_BEGIN();
    for (int64_t c = 0; c < n_chunks + 2; ++c) {
      const int stage = int(c & 1);
      // The state warpgroups release a stage when they finish its chunk.
      if (c >= 2) named_sync(kBarStageFree + stage, kThreads);
      if (c >= n_chunks) continue;
      FUSED_PHASE(8);
      if (c >= kLoadedChunks) {
        named_arrive(kBarChunkReady + stage, kThreads);
        continue;
      }
      // Q(c) and V(c) into the stage chunk c − 2 released, K(c + 1) into chunk
      // c − 2's k stage (released by the same barrier).
      if (loader) {
        wgmma::fence_shared_for_async();  // generic accesses of the stage before TMA's writes
        load_qv(c, stage);
        if (c + 1 < n_chunks && c + 1 < kLoadedChunks) load_k(c + 1);
      }
      const int L = chunk_rows(c);
      const auto qs = stage_tile(sm_q, stage), ks = k_tile(c), vs = stage_tile(sm_v, stage);
      float* const gam = sm_gamma + stage * kChunk;
      float* const bet = sm_beta;
      FUSED_PHASE(3);
      if (pwarp == 0) {  // γ = inclusive in-chunk cumsum of g; rows >= L: g = 0, beta = 0
        float gr[2], br[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const bool in = 2 * lane + j < L;
          gr[j] = in ? raw_to_float(g_next[j], a.g_dtype) : 0.f;
          br[j] = in ? activate_beta(raw_to_float(b_next[j], a.beta_dtype), a.beta_activation) : 0.f;
        }
        if (c + 1 < n_chunks) load_gates(c + 1, g_next, b_next);
        const float pair = gr[0] + gr[1];
        float incl = pair;
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
          const float y = __shfl_up_sync(0xffffffffu, incl, off);
          if (lane >= off) incl += y;
        }
        const float g0 = incl - pair + gr[0], g1 = incl;
        const float g_last = __shfl_sync(0xffffffffu, incl, 31);  // rows >= L add g = 0
        gam[2 * lane] = g0;
        gam[2 * lane + 1] = g1;
        float* const eg = sm_exp_gamma + stage * kChunk;
        float* const dc = sm_decay + stage * kChunk;
        eg[2 * lane] = __expf(g0);
        eg[2 * lane + 1] = __expf(g1);
        dc[2 * lane] = __expf(g_last - g0);
        dc[2 * lane + 1] = __expf(g_last - g1);
        bet[2 * lane] = br[0];
        bet[2 * lane + 1] = br[1];
      }
      FUSED_PHASE(14);
      tma::wait(bar_k + c % kKStages, uint32_t(c / kKStages) & 1u);
      if (L < kChunk || a.use_qk_l2norm) {
        prepare_rows(ks, L, a.use_qk_l2norm);
        wgmma::fence_shared_for_async();  // K is a wgmma operand
      }
      named_sync(kBarProducer, kProducerThreads);
      FUSED_PHASE(9);

      // A = β (K Kᵀ ⊙ Γ), strictly lower, fp32 (wgmma m64n64, both operands K-major).
      float* const tt = sm_t;
      {
        float acc[kChunk / 2];
#pragma unroll
        for (int i = 0; i < kChunk / 2; ++i) acc[i] = 0.f;
        wgmma::fence(acc);
#pragma unroll
        for (int k = 0; k < kDim / 16; ++k)
          wgmma::mma_ss<T, kChunk, wgmma::kK, wgmma::kK>(wgmma::kmajor_desc(ks, 16 * k), wgmma::kmajor_desc(ks, 16 * k),
                                                         acc);
        wgmma::commit();
        // The gates of this thread's rows and columns, read while the wgmmas run.
        float2 g_col[kChunk / 8];
#pragma unroll
        for (int j = 0; j < kChunk / 8; ++j) g_col[j] = *reinterpret_cast<const float2*>(gam + 8 * j + 2 * t4);
        const float g_row[2] = {gam[16 * pwarp + g], gam[16 * pwarp + g + 8]};
        const float b_row[2] = {bet[16 * pwarp + g], bet[16 * pwarp + g + 8]};
        wgmma::wait<0>();
        wgmma::fence_operands(acc);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * pwarp + g + 8 * half;
#pragma unroll
          for (int j = 0; j < kChunk / 8; ++j) {
            const int col = 8 * j + 2 * t4;
            // β_i e^{γ_i − γ_j}, 0 on and above the diagonal.
            const float x[2] = {acc[4 * j + 2 * half] * b_row[half] * masked_exp(col < i, g_row[half] - g_col[j].x),
                                acc[4 * j + 2 * half + 1] * b_row[half] *
                                    masked_exp(col + 1 < i, g_row[half] - g_col[j].y)};
            // The two 32x32 diagonal blocks into T's (inverted there in place),
            // transposed as the substitution reads them (conflict-free); the
            // block below, A_10, into T's unused block above the diagonal
            // (rows 0..31, columns 32..63); the rest is never read.
            if (j / 4 == pwarp / 2) {
              tt[col * kLdF + i] = x[0];
              tt[(col + 1) * kLdF + i] = x[1];
            } else if (j / 4 < pwarp / 2) {
              *reinterpret_cast<float2*>(tt + (i - 32) * kLdF + 32 + col) = make_float2(x[0], x[1]);
            }
          }
        }
      }
      named_sync(kBarProducer, kProducerThreads);
      FUSED_PHASE(10);

      // T = (I + A)⁻¹: the two 32x32 diagonal blocks by forward substitution
      // (warps 0 and 1: warp = block, lane = column) in fp32, in place, column by
      // column of A: once x_m is final it updates every later row at once, so
      // the dependent chain is 31 FMAs deep, and A's column m (stored transposed
      // by the epilogue above: row m of the block) comes in as broadcast float4s...
      if (pwarp < 2) {
        const int b0 = 32 * pwarp;
        const float* const a_cols = tt + b0 * kLdF + b0;  // a_cols[m kLdF + r] = A[b0 + r][b0 + m]
        // The identity column, built here each chunk: as loop-invariant values
        // ptxas would keep them live across the chunk loop; the volatile move
        // pins them inside.
        float one;
        asm volatile("mov.b32 %0, 0x3f800000;\n" : "=f"(one));
        float x[32];
#pragma unroll
        for (int r = 0; r < 32; ++r) x[r] = r == lane ? one : 0.f;
#pragma unroll
        for (int m = 0; m < 31; ++m) {
#pragma unroll
          for (int q = (m + 1) / 4; q < 8; ++q) {
            const float4 v = *reinterpret_cast<const float4*>(a_cols + m * kLdF + 4 * q);
            const float col[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (4 * q + e > m) x[4 * q + e] -= col[e] * x[m];
          }
          // Loads hoisted more than a few steps ahead only cost registers.
          if (m % 4 == 3) asm volatile("" ::: "memory");
        }
        __syncwarp();  // every lane has read the block
#pragma unroll
        for (int r = 0; r < 32; ++r) tt[(b0 + r) * kLdF + b0 + lane] = x[r];
      }
      named_sync(kBarProducer, kProducerThreads);
      FUSED_PHASE(11);
      // ...then the block below, T_10 = −T_11 A_10 T_00, in two tf32 levels of
      // 16x16 quadrants (warp w: quadrant (w / 2, w % 2)); T_11 and T_00 are
      // lower triangular, so only their quadrants on and below the diagonal
      // enter. M = T_11 A_10 goes over A_10 once every warp has read it...
      {
        const int qi = pwarp >> 1, qj = pwarp & 1;
        float m[2][4] = {};
        for (int kk = 0; kk <= qi; ++kk)
          mma::mma_tf32_16x16x16(m, tt + (32 + 16 * qi) * kLdF + 32 + 16 * kk, kLdF, tt + 16 * kk * kLdF + 32 + 16 * qj,
                                 kLdF, lane);
        named_sync(kBarProducer, kProducerThreads);
        mma::store_c_16x16(tt + 16 * qi * kLdF + 32 + 16 * qj, kLdF, m, 1.f, lane);
        named_sync(kBarProducer, kProducerThreads);
        // ...and T_10 = −M T_00 into T's block below the diagonal.
        float t[2][4] = {};
        for (int kk = qj; kk < 2; ++kk)
          mma::mma_tf32_16x16x16(t, tt + 16 * qi * kLdF + 32 + 16 * kk, kLdF, tt + 16 * kk * kLdF + 16 * qj, kLdF, lane);
        mma::store_c_16x16(tt + (32 + 16 * qi) * kLdF + 16 * qj, kLdF, t, -1.f, lane);
      }
      FUSED_PHASE(12);
      tma::wait(bar_qv + stage, uint32_t(c >> 1) & 1u);  // Q(c) and V(c)
      if (L < kChunk || a.use_qk_l2norm) {
        prepare_rows(qs, L, a.use_qk_l2norm);
        if (L < kChunk && item.read_v) prepare_rows(vs, L, false);
        wgmma::fence_shared_for_async();  // Q and V are wgmma operands
      }
      named_sync(kBarProducer, kProducerThreads);  // T complete, Q prepared
      FUSED_PHASE(13);

      // P = Q Kᵀ ⊙ Γ, lower with the diagonal (wgmma m64n64, both K-major), and
      // Tβ = T diag(β) in 16 bits, the state warpgroups' A operand for U and W.
      {
        float acc[kChunk / 2];
#pragma unroll
        for (int i = 0; i < kChunk / 2; ++i) acc[i] = 0.f;
        wgmma::fence(acc);
#pragma unroll
        for (int k = 0; k < kDim / 16; ++k)
          wgmma::mma_ss<T, kChunk, wgmma::kK, wgmma::kK>(wgmma::kmajor_desc(qs, 16 * k), wgmma::kmajor_desc(ks, 16 * k),
                                                         acc);
        wgmma::commit();
        // The gates of this thread's rows and columns, read while the wgmmas run
        // (the exponentials after the wait: 18 registers instead of 32 factors).
        float2 g_col[kChunk / 8];
#pragma unroll
        for (int j = 0; j < kChunk / 8; ++j) g_col[j] = *reinterpret_cast<const float2*>(gam + 8 * j + 2 * t4);
        const float g_row[2] = {gam[16 * pwarp + g], gam[16 * pwarp + g + 8]};
        wgmma::wait<0>();
        wgmma::fence_operands(acc);
        // P's epilogue, and Tβ's element pairs at the same places (T's blocks
        // above the diagonal hold M or are zero: zero there).
        const CoreTile<T, kChunk> pt = p_tile(stage), tb = tb_tile(stage);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * pwarp + g + 8 * half;
#pragma unroll
          for (int j = 0; j < kChunk / 8; ++j) {
            const int col = 8 * j + 2 * t4;
            const float x0 = acc[4 * j + 2 * half] * masked_exp(col <= i, g_row[half] - g_col[j].x);
            const float x1 = acc[4 * j + 2 * half + 1] * masked_exp(col + 1 <= i, g_row[half] - g_col[j].y);
            *reinterpret_cast<uint32_t*>(pt.at(i, col)) = M::pack(x0, x1);
            const float2 t = *reinterpret_cast<const float2*>(tt + i * kLdF + col);
            const float2 b = *reinterpret_cast<const float2*>(bet + col);
            *reinterpret_cast<uint32_t*>(tb.at(i, col)) = j / 2 <= pwarp ? M::pack(t.x * b.x, t.y * b.y) : 0u;
          }
        }
      }
      wgmma::fence_shared_for_async();  // P and Tβ are wgmma operands
      // The chunk is ready: its q, k, v, gates, P and Tβ.
      named_arrive(kBarChunkReady + stage, kThreads);
      // The next chunk overwrites T's tile only after every warp has read it.
      named_sync(kBarProducer, kProducerThreads);
      FUSED_PHASE(15);
    }
    FUSED_PROFILE_END(0);
    return;
  }

  // ===== State warpgroups: the chain of S through the chunks. =====
  set_max_registers<kStateRegisters>();
  const int wr = warp & 3;
  const bool is_u = warp < 4;  // warpgroup 0 (P and U, then Vd) or 1 (W, then Q S and O)
  T* const o_base = static_cast<T*>(a.o) + row * a.o_sb + hv * a.o_sh;

  // The state in the wgmma accumulator layout: s_acc[4 j + e] is key row
  // 16 warp + g + 8 (e / 2), value column 8 j + 2 t4 + e % 2 (warpgroup w: keys 64 w..).
  float s_acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int x = 16 * warp + g + ((i >> 1) & 1) * 8, c = 8 * (i >> 2) + 2 * t4 + (i & 1);
    s_acc[i] = item.init.load(x, c);
  }
  // S's 16-bit copy, the B operand of step 4 (K = keys, N = values).
  auto store_state_copy = [&]() {
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
      const int x = 16 * warp + g + ((i >> 1) & 1) * 8, c = 8 * (i >> 2) + 2 * t4;
      *reinterpret_cast<uint32_t*>(s_copy.at(x, c)) = M::pack(s_acc[i], s_acc[i + 1]);
    }
    wgmma::fence_shared_for_async();
  };
  store_state_copy();

  FUSED_PROFILE_BEGIN();
  for (int64_t c = 0; c < n_chunks; ++c) {
    const int stage = int(c & 1);
    const int64_t t0 = int64_t(bos) + c * kChunk;
    const int L = chunk_rows(c);
    named_sync(kBarChunkReady + stage, kThreads);
    FUSED_PHASE(0);
#if defined(FLASHQLA_FUSED_ISOLATE) && FLASHQLA_FUSED_ISOLATE == 2
    named_arrive(kBarStageFree + stage, kThreads);
    continue;
#endif
    const auto qs = stage_tile(sm_q, stage), ks = k_tile(c), vs = stage_tile(sm_v, stage);
    const float* const exp_gam = sm_exp_gamma + stage * kChunk;  // e^γ
    const float* const decay = sm_decay + stage * kChunk;         // e^{γ_C − γ}
    const CoreTile<T, kChunk> tb = tb_tile(stage), pt = p_tile(stage);

    // --- 1. Warpgroup 0: U = Tβ V (A = Tβ, K-major, and B = V, MN-major, both
    // from shared memory), kept as step 2's accumulator. Warpgroup 1:
    // −W = −Tβ diag(e^γ) K, A = Tβ's rows 16 wr.. through ldmatrix scaled by
    // column in registers (blocks above the diagonal are zero), B = K MN-major,
    // to shared memory.
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    if (is_u) {
      wgmma::fence(acc);
#pragma unroll
      for (int kb = 0; kb < kChunk / 16; ++kb)
        wgmma::mma_ss<T, kDim, wgmma::kK, wgmma::kMN>(wgmma::kmajor_desc(tb, 16 * kb), wgmma::mnmajor_desc(vs, 16 * kb),
                                                      acc);
      wgmma::commit_and_wait(acc);
    } else {
      uint32_t af[kChunk / 16][4];
#pragma unroll
      for (int kb = 0; kb < kChunk / 16; ++kb) {
        if (kb > wr) {
          af[kb][0] = af[kb][1] = af[kb][2] = af[kb][3] = 0u;
          continue;
        }
        mma::load_a(af[kb], tb, 16 * wr, 16 * kb, lane);
        const int c0 = 16 * kb + 2 * t4;
        const float2 e0 = *reinterpret_cast<const float2*>(exp_gam + c0);
        const float2 e8 = *reinterpret_cast<const float2*>(exp_gam + c0 + 8);
        af[kb][0] = M::scale_pair(af[kb][0], e0.x, e0.y);
        af[kb][1] = M::scale_pair(af[kb][1], e0.x, e0.y);
        af[kb][2] = M::scale_pair(af[kb][2], e8.x, e8.y);
        af[kb][3] = M::scale_pair(af[kb][3], e8.x, e8.y);
      }
      wgmma::fence(acc);
#pragma unroll
      for (int kb = 0; kb < kChunk / 16; ++kb)
        wgmma::mma_b_mn<T, kDim>(af[kb], wgmma::mnmajor_desc(ks, 16 * kb), acc);
      wgmma::commit_and_wait(acc);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int i = 16 * wr + g, col = 8 * j + 2 * t4;
        *reinterpret_cast<uint32_t*>(w_tile.at(i, col)) = M::pack(-acc[4 * j], -acc[4 * j + 1]);
        *reinterpret_cast<uint32_t*>(w_tile.at(i + 8, col)) = M::pack(-acc[4 * j + 2], -acc[4 * j + 3]);
        acc[4 * j] = acc[4 * j + 1] = acc[4 * j + 2] = acc[4 * j + 3] = 0.f;
      }
    }
    wgmma::fence_shared_for_async();  // −W is a wgmma A operand
    FUSED_PHASE(1);
    named_sync(kBarState, kStateThreads);
    FUSED_PHASE(2);

    // --- 2. wgmma, A = −W or Q and B = S from shared memory: warpgroup 0
    // Vd = U − W S, warpgroup 1 Q S. While they run, step 3's A operand
    // (K ⊙ e^{γ_C − γ})ᵀ for key rows 16 warp..: ldmatrix.trans of K, scaled by
    // token (column) in registers.
    uint32_t kf[kChunk / 16][4];
    {
      wgmma::fence(acc);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint64_t x = is_u ? wgmma::kmajor_desc(w_tile, 16 * k) : wgmma::kmajor_desc(qs, 16 * k);
        wgmma::mma_ss<T, kDim, wgmma::kK, wgmma::kMN>(x, wgmma::mnmajor_desc(s_copy, 16 * k), acc);
      }
      wgmma::commit();
#pragma unroll
      for (int k = 0; k < kChunk / 16; ++k) {
        mma::load_a_trans(kf[k], ks, 16 * warp, 16 * k, lane);
        const int c0 = 16 * k + 2 * t4;
        const float2 d0 = *reinterpret_cast<const float2*>(decay + c0);
        const float2 d8 = *reinterpret_cast<const float2*>(decay + c0 + 8);
        kf[k][0] = M::scale_pair(kf[k][0], d0.x, d0.y);
        kf[k][1] = M::scale_pair(kf[k][1], d0.x, d0.y);
        kf[k][2] = M::scale_pair(kf[k][2], d8.x, d8.y);
        kf[k][3] = M::scale_pair(kf[k][3], d8.x, d8.y);
      }
      wgmma::wait<0>();
      wgmma::fence_operands(acc);
    }
    FUSED_PHASE(4);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * wr + g + 8 * half;
      if (is_u) {  // Vd: the B operand (K = tokens) of step 3
#pragma unroll
        for (int j = 0; j < 16; ++j)
          *reinterpret_cast<uint32_t*>(vd_tile.at(i, 8 * j + 2 * t4)) =
              M::pack(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
      } else {
        const float eg = exp_gam[i];
#pragma unroll
        for (int j = 0; j < 16; ++j) acc[4 * j + 2 * half] *= eg, acc[4 * j + 2 * half + 1] *= eg;
      }
    }
    if (is_u) wgmma::fence_shared_for_async();
    named_sync(kBarState, kStateThreads);
    FUSED_PHASE(5);

    // --- 3. One wgmma batch a warpgroup: warpgroup 1 O = scale (e^γ Q S + P Vd),
    // written for rows < L; both S = e^{γ_C} S + (K ⊙ e^{γ_C − γ})ᵀ Vd on key rows 64 w...
    {
      const float e_last = exp_gam[kChunk - 1];
#pragma unroll
      for (int i = 0; i < 64; ++i) s_acc[i] *= e_last;
      // A operands: P from shared memory (K-major); kf from step 2.
      if (!is_u) wgmma::fence_operands(acc);
      wgmma::fence_operands(s_acc);
      wgmma::arrive();
      if (!is_u) {
#pragma unroll
        for (int k = 0; k < 4; ++k)
          wgmma::mma_ss<T, kDim, wgmma::kK, wgmma::kMN>(wgmma::kmajor_desc(pt, 16 * k),
                                                        wgmma::mnmajor_desc(vd_tile, 16 * k), acc);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) wgmma::mma_b_mn<T, kDim>(kf[k], wgmma::mnmajor_desc(vd_tile, 16 * k), s_acc);
      wgmma::commit_and_wait();
      wgmma::fence_operands(s_acc);
      // This stage (q, k, v, gates, T) is no longer read: the producer may refill it.
      named_arrive(kBarStageFree + stage, kThreads);
      if (!is_u) {
        wgmma::fence_operands(acc);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * wr + g + 8 * half;
          if (item.write_o && i < L) {
            T* const orow = o_base + (t0 + i) * a.o_st;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
              *reinterpret_cast<uint32_t*>(orow + 8 * j + 2 * t4) =
                  M::pack(a.scale * acc[4 * j + 2 * half], a.scale * acc[4 * j + 2 * half + 1]);
            }
          }
        }
      }
    }
    // Every state warp finished reading S's copy in step 2; the next chunk's
    // ready barrier orders these writes before its step 2.
    FUSED_PHASE(6);
    store_state_copy();
    FUSED_PHASE(7);
  }
  FUSED_PROFILE_END(n_chunks);

  if (item.final_state.ptr != nullptr) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int x = 16 * warp + g + ((i >> 1) & 1) * 8, c = 8 * (i >> 2) + 2 * t4 + (i & 1);
      item.final_state.store(x, c, s_acc[i]);
    }
  }
}

template <typename T>
cudaError_t launch_typed(const ForwardArgs& args, cudaStream_t stream) {
  cudaError_t err =
      cudaFuncSetAttribute(gdn_fwd_fused_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t blocks = work_item_count(args);
  if (blocks == 0) return cudaSuccess;
  TokenMaps maps;
  const int64_t rows = token_rows(args);
  err = encode_token_tile_map(&maps.q, args.q, args.token_dtype, rows, args.T, args.H, args.q_sb, args.q_st, args.q_sh);
  if (err == cudaSuccess)
    err = encode_token_tile_map(&maps.k, args.k, args.token_dtype, rows, args.T, args.H, args.k_sb, args.k_st, args.k_sh);
  if (err == cudaSuccess)
    err = encode_token_tile_map(&maps.v, args.v, args.token_dtype, rows, args.T, args.HV, args.v_sb, args.v_st, args.v_sh);
  if (err != cudaSuccess) return err;
  FLASHQLA_PLAN("gdn_fwd_fused_kernel: pass=%d grid=%lld block=%d smem=%d bytes (chunk %d, K=V=%d, piece %lld chunks)",
                args.piece_pass, (long long)blocks, kThreads, kSmemBytes, kChunk, kDim, (long long)args.piece_chunks);
  gdn_fwd_fused_kernel<T><<<static_cast<unsigned>(blocks), kThreads, kSmemBytes, stream>>>(args, maps);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gdn_fwd_fused(const ForwardArgs& args, cudaStream_t stream) {
  return args.token_dtype == FLASHQLA_DTYPE_BFLOAT16 ? launch_typed<__nv_bfloat16>(args, stream)
                                                    : launch_typed<__half>(args, stream);
}

}  // namespace flashqla::cuda
