#include "cuda/sm90/gdn_fwd_fused_sm90.h"

#include <type_traits>

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
// Warpgroups 0 and 1 run the state chain of chunk c, each for half the values
// (Sᵀ split by value rows: two independent chains); warpgroup 2 loads chunk
// c + 1 and computes its A, P = Q Kᵀ ⊙ Γ, T's two 32x32 diagonal blocks
// (of T = (I + A)⁻¹) and Tβ meanwhile; T's block below them is never formed
// (the state warpgroups apply Tβ by blocks, step 2).
// Registers move to the state warpgroups.
constexpr int kStateThreads = 256;
constexpr int kProducerThreads = 128;
constexpr int kThreads = kStateThreads + kProducerThreads;
constexpr int kStateRegisters = 176, kProducerRegisters = 152;
// setmaxnreg.inc takes registers only from those the CTA's own .dec released
// (it waits otherwise: a deadlock), from the launch allocation (the register
// file over the CTA's threads, rounded down to 8: 168).
constexpr int kLaunchRegisters = (65536 / kThreads) & ~7;
static_assert(kStateThreads * (kStateRegisters - kLaunchRegisters) <=
                  kProducerThreads * (kLaunchRegisters - kProducerRegisters),
              "the state warpgroups' registers come from the producer's");
constexpr int kLdF = kChunk + 4;  // row stride of fp32 [64][64] tiles

// Named barriers (0 is __syncthreads): inside the state warpgroups (once an
// item), inside the producer warpgroup, chunk
// ready (producer -> state, per stage), stage free (state -> producer, per
// stage) and, per state warpgroup, its output tile written.
constexpr int kBarState = 1, kBarProducer = 2, kBarChunkReady = 3, kBarStageFree = 5, kBarOutput = 7;
// The producer's warp pairs (0, 1) and (2, 3), each owning one 32x32 diagonal block of T.
constexpr int kBarProducerPair = 9;

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The lane index read again where it is used (volatile: not merged with the
// kernel's first read), so that ptxas recomputes lane-derived indices instead
// of keeping them live, or spilled, across a loop at its register limit.
__device__ __forceinline__ int lane_again() {
  int l;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(l));
  return l;
}

template <int kRegisters>
__device__ __forceinline__ void set_max_registers() {
  if constexpr (kRegisters > kLaunchRegisters) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  }
}

// Shared memory (bytes). Three stages of k and q and the gate vectors γ, e^γ,
// e^{γ_C − γ} (the producer loads or forms chunk c + 1's while it works on c and
// the state warpgroups on c − 1), two of v, P, Tβ and β (the chunk the producer
// hands over and the one the state warpgroups run); one of everything else.
// Every 16-bit tile is a core-matrix tile (ldmatrix reads it without bank
// conflicts, wgmma through a descriptor). A stage's k and q are one 128-byte
// swizzled [128 rows][128] tile, k's tokens rows ..63 and q's rows 64..: each
// 64-feature column block holds k's rows, then q's, so that [K; Q] is one
// wgmma operand of 128 rows (the state warpgroups' step 1: Sᵀ [K; Q]ᵀ, one
// m64n128k16 a key step instead of two m64n64k16).
// T is the producer's own padded fp32 [64][68] tile: it builds T's two 32x32
// diagonal blocks there in place from A's (the rest of the tile unused). O goes
// out through
// a padded [64 tokens][136] tile, two stages (each state warpgroup its 64
// value columns), so that its rows leave in coalesced stores.
using mma::CoreTile;
constexpr int kKStages = 3;
constexpr int kTile16 = kChunk * kDim * 2;   // [64][128]
constexpr int kTile64 = kChunk * kChunk * 2;  // [64][64]
constexpr int kTileF = kChunk * kLdF * 4;    // fp32 [64][68]
constexpr int kOffQK = 0;
constexpr int kOffV = kOffQK + kKStages * 2 * kTile16;
constexpr int kLdO = kDim + 8;  // row stride of the output tile (conflict-free transposed writes)
constexpr int kOffO = kOffV + 2 * kTile16;
constexpr int kOffP = kOffO + 2 * kChunk * kLdO * 2;
constexpr int kOffTb = kOffP + 2 * kTile64;
constexpr int kOffT = kOffTb + 2 * kTile64;
constexpr int kOffGate = kOffT + kTileF;
constexpr int kGateFloats = (3 * kKStages + 2) * kChunk;  // γ, e^γ, e^{γ_C − γ} as q/k, β two stages
// The item's final-state target, whether it writes O and O's first row, parked
// here by the state warpgroups for the chunk loop (registers fewer at its peak),
// and a chained piece's counters (to raise at the end, to wait for at the start).
constexpr int kOffFinal = kOffGate + kGateFloats * 4;
// Then o's tensor-store coordinates (the item's first token, head, batch row and
// the rows of its last chunk).
constexpr int kOffBar = kOffFinal + 96;  // mbarriers: k stages, then q/v stages
#ifdef FLASHQLA_FUSED_PROFILE
constexpr int kProfileSlots = 20;  // the phase profile's cycles (below), in shared memory
#else
constexpr int kProfileSlots = 0;
#endif
constexpr int kOffProfile = kOffBar + (kKStages + 2) * 8;
constexpr int kSmemBytes = kOffProfile + kProfileSlots * 8;
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
// (benchmarks/tools/fused_phase_profile.cu). The first state thread and the
// first producer thread add the cycles between their phase marks to shared
// memory (state phases 0..2 and 4..6, producer phases 3, 7 and 8..18; in registers
// the counters made the state warpgroups spill and serialize their wgmmas, so
// the profile timed another kernel); at the end CTA 0's add them and the chunk
// count (the last slot) to fused_profile_cycles, which the tool reads back (no
// printf: a call in the kernel would serialize its wgmma pipeline).
#ifdef FLASHQLA_FUSED_PROFILE
__device__ long long fused_profile_cycles[kProfileSlots];
#define FUSED_PHASE(i)                          \
  do {                                          \
    if (profiling) {                            \
      const long long now_ = clock64();         \
      profile[i] += now_ - phase_start;         \
      phase_start = now_;                       \
    }                                           \
  } while (0)
#define FUSED_PROFILE_BEGIN()                                                        \
  long long* const profile = reinterpret_cast<long long*>(smem + kOffProfile);       \
  const bool profiling = threadIdx.x == 0 || threadIdx.x == kStateThreads;           \
  long long phase_start = clock64()
#define FUSED_PROFILE_END(n)                                                             \
  do {                                                                                   \
    if (blockIdx.x == 0 && profiling) {                                                  \
      const bool producer_ = threadIdx.x == kStateThreads;                               \
      for (int i_ = 0; i_ < kProfileSlots - 1; ++i_)                                     \
        if ((i_ == 3 || i_ >= 7) == producer_) fused_profile_cycles[i_] += profile[i_];  \
      if (!producer_) fused_profile_cycles[kProfileSlots - 1] += (n);                    \
    }                                                                                    \
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

// How the state warpgroups write o: not at all (a piece pass that only needs
// the end state); by one TMA tensor store a warpgroup a chunk from its output
// tile ([64 tokens][64 values], 128-byte swizzled: each of the box's rows is
// one whole 128-byte line of o), where o's base and strides allow it (fused_output_tensor_storable);
// else row by row from a padded output tile with 4-byte stores while the next
// chunk's last wgmmas run. (Row stores cost 8-10% of a chunk; one bulk copy a
// row queued in the TMA unit behind the loads: docs/perf.md, v3.15.) A
// partial last chunk goes out by rows either way.
constexpr int kOutputNone = 0, kOutputRows = 1, kOutputTensor = 2;

// 2^x where keep, else 0, without a branch: the exponent is selected (−∞
// where masked), so masked entries never overflow and the epilogues over the
// accumulators stay straight-line code. The epilogues pass differences of
// γ log2(e) (sm_gamma holds γ so scaled): e^{γ_i − γ_j}.
// ex2.approx with denormal results flushed to zero (no range fix-up around
// the MUFU, as __expf has), 2^{−∞} = 0.
__device__ __forceinline__ float masked_exp2(bool keep, float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(keep ? x : -INFINITY));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f;

// The tensor maps of q, k and v (tma_load.cuh), and of o where it is written
// by tensor stores (o_tensor), a kernel parameter.
struct TokenMaps {
  CUtensorMap q, k, v, o;
  int o_tensor;
};

template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_fwd_fused_kernel(const ForwardArgs a, const __grid_constant__ TokenMaps maps) {
  using M = mma::Mma<T>;
  extern __shared__ __align__(1024) unsigned char smem[];
  T* const sm_qk = reinterpret_cast<T*>(smem + kOffQK);
  T* const sm_v = reinterpret_cast<T*>(smem + kOffV);
  // [2][64 tokens][kLdO] by rows; [2][2 warpgroups][64 tokens][64] 128-byte swizzled by tensor stores
  T* const sm_o = reinterpret_cast<T*>(smem + kOffO);
  // Two stages each, [64][64], wgmma B operands: Pᵀ = (Q Kᵀ ⊙ Γ)ᵀ (read
  // MN-major) and Tβ = T diag(β) (K-major), handed over by the producer; Tβ's tile holds T's diagonal
  // blocks times β and, in place of T's block below them, L_10 = (K Kᵀ ⊙ Γ)'s
  // (step 2 of the state warpgroups).
  auto p_tile = [&](int stage) { return CoreTile<T, kChunk>{reinterpret_cast<T*>(smem + kOffP + stage * kTile64)}; };
  auto tb_tile = [&](int stage) { return CoreTile<T, kChunk>{reinterpret_cast<T*>(smem + kOffTb + stage * kTile64)}; };
  float* const sm_t = reinterpret_cast<float*>(smem + kOffT);  // T, [64][kLdF] (producer)
  // Per-token gate vectors of a chunk, written by the producer's warp 2: γ log2(e)
  // (γ: the in-chunk cumsum of g), e^γ and e^{γ_C − γ} (γ_C: the chunk's last γ), three
  // stages each (the state warpgroups read e^γ and e^{γ_C − γ}); β, two stages,
  // for the producer only.
  float* const sm_gamma = reinterpret_cast<float*>(smem + kOffGate);  // [3][64], stage c % 3
  float* const sm_exp_gamma = sm_gamma + kKStages * kChunk;           // [3][64]
  float* const sm_decay = sm_exp_gamma + kKStages * kChunk;           // [3][64]
  float* const sm_beta = sm_decay + kKStages * kChunk;                // [2][64], stage c % 2

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
  // q, k and v tiles land from TMA 128-byte swizzled (tma_load.cuh). k_tile
  // is also [K; Q], the stage's 128 rows (its q_tile the rows from 64).
  auto v_tile = [&](int stage) { return mma::Swizzled128Tile<T, kChunk>{sm_v + stage * kChunk * kDim}; };
  using QKTile = mma::Swizzled128Tile<T, 2 * kChunk>;
  auto k_tile = [&](int64_t c) { return QKTile{sm_qk + int(c % kKStages) * 2 * kChunk * kDim}; };
  auto q_tile = [&](int64_t c) { return QKTile{k_tile(c).base + kChunk * 64}; };
  auto chunk_rows = [&](int64_t c) { return int(min64(kChunk, int64_t(eos - bos) - c * kChunk)); };

  // The loads' completion: one barrier a k stage, one a q/v stage.
  uint64_t* const bar_k = reinterpret_cast<uint64_t*>(smem + kOffBar);  // q and k of a stage
  uint64_t* const bar_qv = bar_k + kKStages;                               // v of a stage
  // A chained piece's counters, parked for the state warpgroups (kept out of
  // registers across the producer's part).
  unsigned* volatile* const sm_signal = reinterpret_cast<unsigned**>(smem + kOffFinal + 56);
  unsigned* volatile* const sm_wait = reinterpret_cast<unsigned**>(smem + kOffFinal + 64);
  volatile unsigned* const sm_wait_for = reinterpret_cast<unsigned*>(smem + kOffFinal + 72);
  if (tid == 0) {
    for (int i = 0; i < kProfileSlots; ++i) reinterpret_cast<long long*>(smem + kOffProfile)[i] = 0;
    for (int i = 0; i < kKStages + 2; ++i) tma::barrier_init(bar_k + i, 1);
    tma::fence_barrier_init();
    *sm_signal = item.link.signal ? item.link.counter : nullptr;
    *sm_wait = item.link.wait_for > 0 ? item.link.counter : nullptr;
    *sm_wait_for = item.link.wait_for;
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
    // The first lanes of warps 0, 1 and 2 issue a chunk's loads (k, q and v:
    // TMA, a few boxes each; chunk 0's q and k the loader thread, warp 0's),
    // every producer thread waits for them on the stage's barrier. Chunk c's q
    // and k stage is c % 3 (its (c / 3)-th use), its v stage c % 2 (its
    // (c / 2)-th use).
    const bool loader = tid == kStateThreads;
    const int head_qk = int(h), head_v = int(hv), brow = int(row);
    // Chunk c's k (its two 64-feature boxes, with the barrier's byte count for
    // both tensors) or q (its two boxes) into the stage's [K; Q] tile: each
    // 64-feature column block holds k's rows, then q's.
    auto load_qk_part = [&](int64_t c, bool k_part) {
      uint64_t* const bar = bar_k + c % kKStages;
      if (k_part) tma::arrive_expect_bytes(bar, 2 * kTile16);
      const auto t = k_part ? k_tile(c) : q_tile(c);
#pragma unroll
      for (int b = 0; b < 2; ++b)
        tma::load_token_tile(t.at(0, 64 * b), k_part ? &maps.k : &maps.q, bar, int(bos + c * kChunk), head_qk, brow, b);
    };
    auto load_v = [&](int64_t c, int stage) {  // only where item.read_v
      uint64_t* const bar = bar_qv + stage;
      tma::arrive_expect_bytes(bar, kTile16);
      tma::load_token_tile(v_tile(stage).base, &maps.v, bar, int(bos + c * kChunk), head_v, brow);
    };
    // Rows of a landed tile (warp: row blocks w and w + 4; lane: row lane % 8,
    // 16-byte segments lane / 8 + 4 s of it, conflict-free): rows >= L zeroed
    // (past a packed sequence's end they hold the next sequence's tokens), the
    // others scaled to x · rsqrt(Σx² + 1e-6) where normalize.
    auto prepare_rows = [&](auto tile, int L, bool normalize) {
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
    // The gate vectors of chunk cc (one warp: γ = inclusive in-chunk cumsum of
    // g, e^γ, e^{γ_C − γ}, β; rows >= L: g = 0, β = 0) from the raw bits loaded
    // before; then chunk cc + 1's loads. Warp 2 runs it for chunk c + 1 while
    // warps 0 and 1 invert chunk c's diagonal blocks.
    uint32_t g_next[2] = {}, b_next[2] = {};
    auto compute_gates = [&](int64_t cc) {
      const int Lc = chunk_rows(cc);
      float gr[2], br[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool in = 2 * lane + j < Lc;
        gr[j] = in ? raw_to_float(g_next[j], a.g_dtype) : 0.f;
        br[j] = in ? activate_beta(raw_to_float(b_next[j], a.beta_dtype), a.beta_activation) : 0.f;
      }
      if (cc + 1 < n_chunks) load_gates(cc + 1, g_next, b_next);
      const float pair = gr[0] + gr[1];
      float incl = pair;
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const float y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      const float g0 = incl - pair + gr[0], g1 = incl;
      const float g_last = __shfl_sync(0xffffffffu, incl, 31);  // rows >= L add g = 0
      const int gs = int(cc % kKStages) * kChunk, bs = int(cc & 1) * kChunk;
      sm_gamma[gs + 2 * lane] = g0 * kLog2e;
      sm_gamma[gs + 2 * lane + 1] = g1 * kLog2e;
      sm_exp_gamma[gs + 2 * lane] = __expf(g0);
      sm_exp_gamma[gs + 2 * lane + 1] = __expf(g1);
      sm_decay[gs + 2 * lane] = __expf(g_last - g0);
      sm_decay[gs + 2 * lane + 1] = __expf(g_last - g1);
      sm_beta[bs + 2 * lane] = br[0];
      sm_beta[bs + 2 * lane + 1] = br[1];
    };
    if (pwarp == 2 && n_chunks > 0) {  // chunk 0's before the loop (the barrier below orders them)
      load_gates(0, g_next, b_next);
      compute_gates(0);
    }
    // P's and Tβ's two stages (adjacent) zeroed once: Pᵀ's column tiles left of
    // each warp's rows and the upper-right 16x16 quadrants of Tβ's 32x32
    // diagonal blocks stay zero (the epilogues and the inverse write the rest
    // that is read every chunk).
    static_assert(kOffTb == kOffP + 2 * kTile64, "P's and Tβ's stages adjacent");
    for (int i = tid - kStateThreads; i < 4 * kTile64 / 16; i += kProducerThreads)
      reinterpret_cast<uint4*>(smem + kOffP)[i] = make_uint4(0u, 0u, 0u, 0u);
    wgmma::fence_shared_for_async();
    if (!item.read_v) {  // v = 0 (a piece's transition): both v stages zeroed once, never loaded
      for (int i = tid - kStateThreads; i < 2 * kTile16 / 16; i += kProducerThreads)
        reinterpret_cast<uint4*>(sm_v)[i] = make_uint4(0u, 0u, 0u, 0u);
      wgmma::fence_shared_for_async();
    }
    if (loader && n_chunks > 0) {
      tma::prefetch_map(&maps.q);
      tma::prefetch_map(&maps.k);
      tma::prefetch_map(&maps.v);
      load_qk_part(0, true);
      load_qk_part(0, false);
    }
    // K [K; Q]ᵀ of chunk cc (wgmma m64n128, A = K, B = the stage's [K; Q],
    // both K-major) into acc: n8 tiles ..7 K Kᵀ, 8.. K Qᵀ = Pᵀ before its
    // decay. Issued a chunk ahead: at the end of chunk cc − 1's work, so that it
    // runs behind the hand-over and the wait for a free stage, and chunk cc's
    // epilogue finds it done. Rows past the end are zeroed (and l2-normalized)
    // first.
    float acc[kChunk];
    auto issue_kkt = [&](int64_t cc) {
      const int Lc = chunk_rows(cc);
      tma::wait(bar_k + cc % kKStages, uint32_t(cc / kKStages) & 1u);  // Q(cc), K(cc)
      if (Lc < kChunk || a.use_qk_l2norm) {
        prepare_rows(k_tile(cc), Lc, a.use_qk_l2norm);
        prepare_rows(q_tile(cc), Lc, a.use_qk_l2norm);
        wgmma::fence_shared_for_async();  // Q and K are wgmma operands
        named_sync(kBarProducer, kProducerThreads);
      }
#pragma unroll
      for (int i = 0; i < kChunk; ++i) acc[i] = 0.f;
      wgmma::fence(acc);
      const auto kt = k_tile(cc);  // A: its rows ..63 (K); B: all 128 ([K; Q])
#pragma unroll
      for (int k = 0; k < kDim / 16; ++k)
        wgmma::mma_ss<T, 2 * kChunk, wgmma::kK, wgmma::kK>(wgmma::kmajor_desc(kt, 16 * k),
                                                           wgmma::kmajor_desc(kt, 16 * k), acc);
      wgmma::commit();
    };
    // Chunk 0's gates written (warp 2) before any warp reads them: no other
    // barrier of the producer's comes between (the loads' barriers order TMA's
    // writes only).
    named_sync(kBarProducer, kProducerThreads);
    FUSED_PROFILE_BEGIN();
    if (n_chunks > 0 && kLoadedChunks > 0) issue_kkt(0);
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
      // V(c) into the stage chunk c − 2 released, Q(c + 1) and K(c + 1) into
      // chunk c − 2's q/k stage (released by the same barrier).
      // No proxy fence before the loads: the stage's generic writes (rows of a
      // partial chunk, zeroed v) were fenced by their writers when made, and its
      // generic reads ended before the stage barrier above (a read before an
      // async-proxy write needs no fence, as in CUTLASS's TMA pipelines).
      // The loads spread over three warps' first lanes (k, q, v), so that no
      // one warp's epilogue starts behind all five TMA issues; the q/k barrier's
      // byte count is set by k's issuer before its own copies (a copy of q's
      // completing first only takes the count below zero while k's arrival is
      // still pending, so the phase cannot complete early).
      if (lane == 0 && c + 1 < n_chunks && c + 1 < kLoadedChunks) {
        if (pwarp == 0) load_qk_part(c + 1, true);
        else if (pwarp == 1) load_qk_part(c + 1, false);
      }
      if (lane == 0 && pwarp == 2 && item.read_v) load_v(c, stage);
      const int L = chunk_rows(c);
      const auto vs = v_tile(stage);
      float* const gam = sm_gamma + int(c % kKStages) * kChunk;
      float* const bet = sm_beta + stage * kChunk;
      FUSED_PHASE(3);
      FUSED_PHASE(14);
      // T's tile is rewritten below: every producer warp has left chunk c − 1
      // (for c >= 2 the stage barrier above, which every producer thread joins, says so).
      if (c == 1) named_sync(kBarProducer, kProducerThreads);
      FUSED_PHASE(9);

      // A = β (K Kᵀ ⊙ Γ), strictly lower, fp32: K Kᵀ (issued a chunk ahead,
      // issue_kkt) and its epilogue into T's tile; Pᵀ = (Q Kᵀ ⊙ Γ)ᵀ (issued
      // with it, K Qᵀ), its epilogue into the stage's P tile.
      float* const tt = sm_t;
      {
        // The gates of this thread's rows and columns, read while the wgmmas finish.
        const int g = lane_again() >> 2, t4 = lane_again() & 3;
        float2 g_col[kChunk / 8];
#pragma unroll
        for (int j = 0; j < kChunk / 8; ++j) g_col[j] = *reinterpret_cast<const float2*>(gam + 8 * j + 2 * t4);
        const float g_row[2] = {gam[16 * pwarp + g], gam[16 * pwarp + g + 8]};
        const float b_row[2] = {bet[16 * pwarp + g], bet[16 * pwarp + g + 8]};
        wgmma::wait<0>();
        wgmma::fence_operands(acc);
        FUSED_PHASE(16);
        // The epilogues, one pass over the warp's 16 token rows i (the warp index
        // a compile-time constant: each warp's code knows which of its column
        // tiles hold what). One exponential a position (i, j), shared by the
        // entries there: e^{γ_i − γ_j} below the diagonal (A's and L_10's),
        // e^{γ_j − γ_i} on and above it (Pᵀ's, and the L_10 quarters warps 0 and
        // 1 take from above the diagonal, below); 32 a thread on every warp:
        // - Pᵀ = (Q Kᵀ ⊙ Γ)ᵀ, 0 below the diagonal ((K Qᵀ)[i][j] = (Q Kᵀ)[j][i],
        //   taken for j >= i), into the stage's P tile as it is (the state
        //   warpgroups read it as an MN-major operand); column tiles wholly left
        //   of the warp's rows (8 j + 7 < 16 w) are zeros, written once for the
        //   item (below), not a chunk;
        // - A = β (K Kᵀ ⊙ Γ), 0 on and above the diagonal: the warp's 16 rows of
        //   its 32x32 diagonal block, transposed into T's tile (inverted there in
        //   place; the substitution reads them so, conflict-free);
        // - a quarter of the block below the diagonal blocks, L_10 = (K Kᵀ ⊙ Γ)'s
        //   rows 32.., columns ..31 (A_10 without β), in 16 bits into Tβ's tile
        //   there, the state warpgroups' operand (T's block below the diagonal
        //   is never formed: step 2 of the state warpgroups). K Kᵀ is symmetric,
        //   so warps 0 and 1 take their quarters from their own rows' columns
        //   32..63 (warp 0: L_10[16..31][0..15], warp 1: L_10[0..15][16..31];
        //   the factor there e^{γ_j − γ_i}, Pᵀ's); warps 2 and 3 theirs
        //   directly (warp 2: L_10[0..15][0..15], warp 3: L_10[16..31][16..31]).
        // The rest of the accumulators is never read.
        const CoreTile<T, kChunk> pt = p_tile(stage);
        const CoreTile<T, kChunk> tb = tb_tile(stage);
        auto epilogue = [&](auto warp_index) {
          constexpr int kWarp = decltype(warp_index)::value;
          constexpr int kDiag = 4 * (kWarp / 2);                  // the diagonal block's first column tile
          constexpr int kQuarter = kWarp < 2 ? 6 - 2 * kWarp : 2 * (kWarp - 2);  // the quarter's
          constexpr bool kSymmetric = kWarp < 2;
          constexpr int kBelow = 2 * kWarp + 2;  // column tiles >= this are above every row of the warp
          constexpr int kFirstP = 2 * kWarp;     // column tiles < this are left of every row of the warp
          const float* const acc_p = acc + kChunk / 2;  // Pᵀ's n8 tiles
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int i = 16 * kWarp + g + 8 * half;
#pragma unroll
            for (int j = 0; j < kChunk / 8; ++j) {
              const int col = 8 * j + 2 * t4;
              const float e0 = masked_exp2(true, col < i ? g_row[half] - g_col[j].x : g_col[j].x - g_row[half]);
              const float e1 = masked_exp2(true, col + 1 < i ? g_row[half] - g_col[j].y : g_col[j].y - g_row[half]);
              if (j >= kFirstP)
                *reinterpret_cast<uint32_t*>(pt.at(i, col)) =
                    M::pack(col >= i ? acc_p[4 * j + 2 * half] * e0 : 0.f,
                            col + 1 >= i ? acc_p[4 * j + 2 * half + 1] * e1 : 0.f);
              if (kSymmetric && j >= kQuarter && j < kQuarter + 2) {
                // (K Kᵀ)[i][col] is L's entry at row col (>= 32 > i), column i.
                *tb.at(col, i) = T(acc[4 * j + 2 * half] * e0);
                *tb.at(col + 1, i) = T(acc[4 * j + 2 * half + 1] * e1);
              }
              // A's entries above the warp's rows are never read (in the
              // diagonal block's lower-left quadrant, transposed, unused).
              if (j >= kBelow) continue;
              if (j >= kDiag && j < kDiag + 4) {
                tt[col * kLdF + i] = col < i ? acc[4 * j + 2 * half] * b_row[half] * e0 : 0.f;
                tt[(col + 1) * kLdF + i] = col + 1 < i ? acc[4 * j + 2 * half + 1] * b_row[half] * e1 : 0.f;
              }
              if (!kSymmetric && j >= kQuarter && j < kQuarter + 2)
                *reinterpret_cast<uint32_t*>(tb.at(i, col)) =
                    M::pack(acc[4 * j + 2 * half] * e0, acc[4 * j + 2 * half + 1] * e1);
            }
          }
        };
        using std::integral_constant;
        if (pwarp == 0) epilogue(integral_constant<int, 0>{});
        else if (pwarp == 1) epilogue(integral_constant<int, 1>{});
        else if (pwarp == 2) epilogue(integral_constant<int, 2>{});
        else epilogue(integral_constant<int, 3>{});
        FUSED_PHASE(17);
      }
      // No producer barrier here: each warp's 16x16 diagonal block of A (its
      // rows, their columns) was written by its own epilogue, and nothing of the
      // other warps' is read before the barrier after the substitution.
      __syncwarp();
      FUSED_PHASE(10);

      // T = (I + A)⁻¹'s two 32x32 diagonal blocks in two levels. First the four
      // 16x16 diagonal blocks by forward substitution (warp = block, lanes
      // 0..15 = columns; lanes 16..31 compute the same, each half stores half) in
      // fp32, column by column of A: once x_m is final it updates every later
      // row at once, so the dependent chain is 15 FMAs deep, and A's column m
      // (stored transposed by the epilogue above: row m of the block) comes in
      // as broadcast float4s.
      {
        const int b0 = 16 * pwarp, col = lane & 15;
        const float* const a_cols = tt + b0 * kLdF + b0;  // a_cols[m kLdF + r] = A[b0 + r][b0 + m]
        // The identity column, built here each chunk: as loop-invariant values
        // ptxas would keep them live across the chunk loop; the volatile move
        // pins them inside.
        float one;
        asm volatile("mov.b32 %0, 0x3f800000;\n" : "=f"(one));
        float x[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) x[r] = r == col ? one : 0.f;
#pragma unroll
        for (int m = 0; m < 15; ++m) {
#pragma unroll
          for (int q = (m + 1) / 4; q < 4; ++q) {
            const float4 v = *reinterpret_cast<const float4*>(a_cols + m * kLdF + 4 * q);
            const float cv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
              if (4 * q + e > m) x[4 * q + e] -= cv[e] * x[m];
          }
        }
        __syncwarp();  // every lane has read the block
        // T's block in fp32 (the levels below read it) and Tβ's in 16 bits (β of
        // this lane's column), the latter the state's operand directly. Both
        // half-warps hold the whole column and store half of it each: lanes
        // ..15 rows 0..3 and 8..11, lanes 16.. rows 4..7 and 12..15 (four rows
        // apart, 4 · kLdF floats: the fp32 stores of one instruction fall in
        // distinct banks).
        {
          const float b_col = bet[b0 + col];
          const CoreTile<T, kChunk> tb = tb_tile(stage);
          const bool upper = lane >= 16;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int r0 = 8 * h + e;  // lanes ..15 store row r0, lanes 16.. row r0 + 4
              const int r = r0 + (upper ? 4 : 0);
              const float xr = upper ? x[r0 + 4] : x[r0];
              tt[(b0 + r) * kLdF + b0 + col] = xr;
              *tb.at(b0 + r, b0 + col) = T(xr * b_col);
            }
          }
        }
      }
      FUSED_PHASE(7);
      // Each 32x32 diagonal block's second level needs its two 16x16 blocks and
      // A_10, all of its warp pair's: a barrier a pair.
      named_sync(kBarProducerPair + pwarp / 2, 64);
      FUSED_PHASE(18);
      // Then, inside each 32x32 diagonal block (warp 0 the block at 0, warp 3 the
      // block at 32, each after its pair's barrier),
      // its block below the diagonal, T_10 = −T_11 A_10 T_00 (16x16, tf32):
      // A_10 read where the epilogue left it (transposed, in the block's unused
      // upper-right quadrant), M = T_11 A_10 in registers, the accumulator taken
      // as the next product's A operand, and T_10 only in 16 bits, as Tβ's block
      // (the fp32 tile never holds it). Warp 2 meanwhile forms the next chunk's gates
      // (into the stages chunk c + 1 reads, after the producer's stage barrier).
      if (pwarp == 2 && c + 1 < n_chunks) compute_gates(c + 1);
      if (pwarp == 0 || pwarp == 3) {
        const int b0 = 32 * (pwarp / 2);
        float m16[2][4] = {};
        mma::mma_tf32_16x16x16_bt(m16, tt + (b0 + 16) * kLdF + b0 + 16, kLdF, tt + b0 * kLdF + b0 + 16, kLdF, lane);
        float t16[2][4] = {};  // M T_00 = −T_10
        mma::mma_tf32_16x16x16_acc_a(t16, m16, tt + b0 * kLdF + b0, kLdF, lane);
        const int g = lane_again() >> 2, t4 = lane_again() & 3;
        const CoreTile<T, kChunk> tb = tb_tile(stage);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int cc = b0 + 8 * nt + 2 * t4, row = b0 + 16 + g;
          const float2 b = *reinterpret_cast<const float2*>(bet + cc);
          *reinterpret_cast<uint32_t*>(tb.at(row, cc)) = M::pack(-t16[nt][0] * b.x, -t16[nt][1] * b.y);
          *reinterpret_cast<uint32_t*>(tb.at(row + 8, cc)) = M::pack(-t16[nt][2] * b.x, -t16[nt][3] * b.y);
        }
      }
      // (No barrier: nothing of the producer's reads these blocks again in this
      // chunk, and the hand-over's barrier orders them for the state warpgroups.)
      FUSED_PHASE(11);
      FUSED_PHASE(12);
      if (item.read_v) {
        tma::wait(bar_qv + stage, uint32_t(c >> 1) & 1u);  // V(c)
        if (L < kChunk) {
          prepare_rows(vs, L, false);
          wgmma::fence_shared_for_async();  // V is a wgmma operand
        }
      }
      FUSED_PHASE(13);
      // (K(c + 1) was loaded at this chunk's start: landed by now.)
      if (c + 1 < n_chunks && c + 1 < kLoadedChunks) issue_kkt(c + 1);

      wgmma::fence_shared_for_async();  // Tβ is a wgmma operand
      // The chunk is ready: its q, k, v, gates and Tβ.
      named_arrive(kBarChunkReady + stage, kThreads);
      // No barrier here: the next chunk writes T's tile (and the gate vectors'
      // stages) only after its stage barrier (its explicit one for chunk 1),
      // which every warp reaches only once it has finished this chunk.
      FUSED_PHASE(15);
    }
    FUSED_PROFILE_END(0);
    return;
  }

  // ===== State warpgroups: the chain of S through the chunks. =====
  // The state is kept transposed, Sᵀ [values][keys], and split by value rows:
  // warpgroup w owns values 64 w.. and runs its own chain, meeting the other only
  // at the producer's barriers. S is the A operand (registers) of every state
  // GEMM, each GEMM's accumulator the next one's A operand; W and U are never
  // formed: V_new = Tβ (V − e^γ ⊙ K S).
  set_max_registers<kStateRegisters>();
  const int wr = warp & 3;
  const int v0 = 64 * (warp >> 2);  // the warpgroup's first value
  StateTarget* const sm_final = reinterpret_cast<StateTarget*>(smem + kOffFinal);
  // Read back in the loop through volatile pointers: as plain loads of values
  // the loop does not write, they would be hoisted out of it into registers.
  volatile int* const sm_output_mode = reinterpret_cast<int*>(smem + kOffFinal + 40);
  static_assert(sizeof(StateTarget) <= 40, "the final-state target fits its slot");
  T* volatile* const sm_o_rows = reinterpret_cast<T**>(smem + kOffFinal + 48);
  volatile int* const sm_o_coords = reinterpret_cast<int*>(smem + kOffFinal + 80);  // token, head, row, last rows
  if (tid == 0) {
    *sm_final = item.final_state;
    *sm_output_mode = item.write_o ? (maps.o_tensor ? kOutputTensor : kOutputRows) : kOutputNone;
    sm_o_coords[0] = bos;
    sm_o_coords[1] = int(hv);
    sm_o_coords[2] = int(row);
    sm_o_coords[3] = int(min64(kChunk, int64_t(eos - bos) - (n_chunks - 1) * kChunk));
    *sm_o_rows = static_cast<T*>(a.o) + row * a.o_sb + hv * a.o_sh + int64_t(bos) * a.o_st;  // the item's first token
  }

  // Sᵀ in the wgmma accumulator layout (m64n128): s_acc[4 j + e] is value
  // v0 + 16 wr + g + 8 (e / 2), key 8 j + 2 t4 + e % 2.
  float s_acc[64];
  // The output pass's start states come from the piece scan, which may still be
  // running (programmatic dependent launch); no-op in any other launch. Only the
  // state warpgroups read what an earlier grid of the forward wrote.
  wait_for_prerequisite_grids();
  // A chained piece's start state is its predecessor's end state.
  if (unsigned* const wait = *sm_wait; wait != nullptr) wait_until_at_least(wait, *sm_wait_for);
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int v = v0 + 16 * wr + g + ((i >> 1) & 1) * 8, k = 8 * (i >> 2) + 2 * t4 + (i & 1);
    s_acc[i] = item.init.load(k, v);
  }
  // An accumulator's 16 columns 16 kb.. as an A fragment (16 bits): the mma.sync
  // A layout is the accumulator layout of two adjacent n8 tiles.
  auto a_fragment = [&](const float* d, float lo0, float hi0, float lo8, float hi8, uint32_t (&f)[4]) {
    f[0] = M::pack(d[0] * lo0, d[1] * hi0);
    f[1] = M::pack(d[2] * lo0, d[3] * hi0);
    f[2] = M::pack(d[4] * lo8, d[5] * hi8);
    f[3] = M::pack(d[6] * lo8, d[7] * hi8);
  };

  // The warpgroup's output tile of a stage for tensor stores.
  auto tensor_tile = [&](int st) {
    return mma::Swizzled128Tile<T, kChunk>{sm_o + (2 * st + (warp >> 2)) * kChunk * (kDim / 2)};
  };
  // Rows < rows of chunk cc's output tile to o (a warp a row's 64 values of the
  // warpgroup's, coalesced), from the padded tile (by rows) or the tensor
  // stores' tile (its partial last chunk).
  auto store_output_rows = [&](int cc, int rows, bool tensor_tile_layout) {
    const int ln = lane_again();
    T* const o_chunk = *sm_o_rows + int64_t(cc) * kChunk * a.o_st + v0 + 2 * ln;
    if (tensor_tile_layout) {
      const auto tile = tensor_tile(cc & 1);
      for (int i = wr; i < rows; i += 4)
        *reinterpret_cast<uint32_t*>(o_chunk + i * a.o_st) = *reinterpret_cast<const uint32_t*>(tile.at(i, 2 * ln));
      return;
    }
    const T* const ot = sm_o + (cc & 1) * kChunk * kLdO + v0 + 2 * ln;
#pragma unroll 4
    for (int i = wr; i < rows; i += 4)
      *reinterpret_cast<uint32_t*>(o_chunk + i * a.o_st) = *reinterpret_cast<const uint32_t*>(ot + i * kLdO);
  };
  // One thread a warpgroup issues its tensor stores (the lane read again: no
  // register held across the chunk loop).
  auto o_issuer = [&] { return wr == 0 && lane_again() == 0; };
  // Loop-carried scalars kept few (the chunk loop's register peak is step 1).
  const int nc = int(n_chunks);
  named_sync(kBarState, kStateThreads);  // sm_final, sm_output_mode written
  FUSED_PROFILE_BEGIN();
  for (int c = 0; c < nc; ++c) {
    const int stage = c & 1;
    // Chunk c − 2's tensor store has read this stage's output tile before any
    // thread passes the barrier below (and writes the tile again, step 4).
    if (o_issuer() && *sm_output_mode == kOutputTensor) tma::wait_stores_read<1>();
    named_sync(kBarChunkReady + stage, kThreads);
    FUSED_PHASE(0);
#if defined(FLASHQLA_FUSED_ISOLATE) && FLASHQLA_FUSED_ISOLATE == 2
    named_arrive(kBarStageFree + stage, kThreads);
    continue;
#endif
    const int qk_stage = c % kKStages;
    const auto ks = k_tile(c);  // [K; Q]
    const auto vs = v_tile(stage);
    const float* const exp_gam = sm_exp_gamma + qk_stage * kChunk;  // e^γ
    const float* const decay = sm_decay + qk_stage * kChunk;         // e^{γ_C − γ}
    const CoreTile<T, kChunk> tb = tb_tile(stage), pt = p_tile(stage);

    // --- 1. [(K S)ᵀ | Oᵀ] = Sᵀ [K; Q]ᵀ (m64n128k128, A = Sᵀ in 16 bits, B =
    // the stage's [K; Q] K-major); then Vᵀ's fragments (values 16 wr.. of the
    // warpgroup's, tokens as K) through ldmatrix.trans.
    float kq_acc[kChunk];  // n8 tiles ..7: (K S)ᵀ, 8..: Oᵀ
    auto& ks_acc = *reinterpret_cast<float(*)[kChunk / 2]>(kq_acc);
    auto& o_acc = *reinterpret_cast<float(*)[kChunk / 2]>(kq_acc + kChunk / 2);
    uint32_t vf[kChunk / 16][4];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) kq_acc[i] = 0.f;
    // Batches of kKeyBlocks keys blocks each, a batch's fragments made once the
    // previous one finished (fewer registers of fragments at the peak; the
    // other warpgroup's wgmmas fill the gaps).
    constexpr int kKeyBlocks = 4;
#pragma unroll
    for (int half = 0; half < kDim / 16 / kKeyBlocks; ++half) {
      uint32_t sf[kKeyBlocks][4];
#pragma unroll
      for (int kb = 0; kb < kKeyBlocks; ++kb) a_fragment(s_acc + 8 * (kKeyBlocks * half + kb), 1.f, 1.f, 1.f, 1.f, sf[kb]);
      wgmma::fence(kq_acc);
#pragma unroll
      for (int kb = 0; kb < kKeyBlocks; ++kb)
        wgmma::mma<T, 2 * kChunk>(sf[kb], wgmma::kmajor_desc(ks, 16 * (kKeyBlocks * half + kb)), kq_acc);
      wgmma::commit();
      if (half == 0) FUSED_PHASE(1);
      wgmma::wait<0>();
      wgmma::fence_operands(kq_acc);
    }
#pragma unroll
    for (int kb = 0; kb < kChunk / 16; ++kb) mma::load_a_trans(vf[kb], vs, v0 + 16 * wr, 16 * kb, lane);
    FUSED_PHASE(2);
    asm volatile("" ::: "memory");  // the next step's shared-memory loads stay in it

    // --- 2. V'ᵀ = Vᵀ − (K S)ᵀ diag(e^γ) and Oᵀ diag(e^γ), then V_new = Tβ V' by
    // T's 32x32 blocks, T's block below the diagonal never formed: with
    // T_10 = −T_11 A_10 T_00 and A_10 = diag(β_1) L_10,
    //   V_new,0 = (Tβ)_00 V'_0,  V_new,1 = (Tβ)_11 (V'_1 − L_10 V_new,0)
    // (tokens ..31 and 32..; L_10 in Tβ's tile below the diagonal). Transposed,
    // three m64n32 steps with B K-major from Tβ's tile: V_new,0ᵀ, then V'_1ᵀ −
    // V_new,0ᵀ L_10ᵀ accumulated onto V'_1ᵀ in fp32, then V_new,1ᵀ.
    float nv_acc[kChunk / 2];  // V_newᵀ: tokens ..31 in nv_acc[..15], 32.. in nv_acc[16..]
    auto token_half = [](float* d) -> float(&)[kChunk / 4] { return *reinterpret_cast<float(*)[kChunk / 4]>(d); };
    {
      float x1[kChunk / 4];  // V'_1ᵀ in fp32 (accumulator layout, tokens 32..)
#pragma unroll
      for (int kb = 0; kb < kChunk / 16; ++kb) {
        const int c0 = 16 * kb + 2 * t4;
        const float2 e0 = *reinterpret_cast<const float2*>(exp_gam + c0);
        const float2 e8 = *reinterpret_cast<const float2*>(exp_gam + c0 + 8);
        const float* d = ks_acc + 8 * kb;
        float* o = o_acc + 8 * kb;  // Oᵀ diag(e^γ), with the same factors
        const float sc[8] = {e0.x, e0.y, e0.x, e0.y, e8.x, e8.y, e8.x, e8.y};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float2 v = M::unpack(vf[kb][q]);
          const float x0 = v.x - d[2 * q] * sc[2 * q], x1_ = v.y - d[2 * q + 1] * sc[2 * q + 1];
          if (kb < 2) {
            vf[kb][q] = M::pack(x0, x1_);
          } else {
            x1[8 * (kb - 2) + 2 * q] = x0;
            x1[8 * (kb - 2) + 2 * q + 1] = x1_;
          }
          o[2 * q] *= sc[2 * q], o[2 * q + 1] *= sc[2 * q + 1];
        }
        if (kb == 1) {  // V_new,0ᵀ = V'_0ᵀ (Tβ)_00ᵀ, running while the rest is formed
#pragma unroll
          for (int i = 0; i < kChunk / 2; ++i) nv_acc[i] = 0.f;
          wgmma::fence(token_half(nv_acc));
#pragma unroll
          for (int k = 0; k < 2; ++k) wgmma::mma<T, kChunk / 2>(vf[k], wgmma::kmajor_desc(tb, 16 * k), token_half(nv_acc));
          wgmma::commit();
        }
      }
      wgmma::wait<0>();
      wgmma::fence_operands(token_half(nv_acc));
      // V'_1ᵀ −= V_new,0ᵀ L_10ᵀ (A = −V_new,0ᵀ in 16 bits).
      uint32_t uf[2][4];
#pragma unroll
      for (int k = 0; k < 2; ++k) a_fragment(nv_acc + 8 * k, -1.f, -1.f, -1.f, -1.f, uf[k]);
      wgmma::fence(x1);
#pragma unroll
      for (int k = 0; k < 2; ++k) wgmma::mma<T, kChunk / 2>(uf[k], wgmma::kmajor_desc(tb, 16 * k, 32), x1);
      wgmma::commit_and_wait(x1);
      // V_new,1ᵀ = (V'_1 − L_10 V_new,0)ᵀ (Tβ)_11ᵀ.
#pragma unroll
      for (int k = 0; k < 2; ++k) a_fragment(x1 + 8 * k, 1.f, 1.f, 1.f, 1.f, vf[2 + k]);
      wgmma::fence(token_half(nv_acc + kChunk / 4));
#pragma unroll
      for (int k = 0; k < 2; ++k)
        wgmma::mma<T, kChunk / 2>(vf[2 + k], wgmma::kmajor_desc(tb, 32 + 16 * k, 32), token_half(nv_acc + kChunk / 4));
      wgmma::commit_and_wait(token_half(nv_acc + kChunk / 4));
    }
    FUSED_PHASE(4);
    asm volatile("" ::: "memory");  // the next step's shared-memory loads stay in it

    // --- 3. Sᵀ = e^{γ_C} Sᵀ + (V_newᵀ diag(e^{γ_C − γ})) K (B = K MN-major),
    // then Oᵀ += V_newᵀ Pᵀ (B = Pᵀ MN-major, the producer's).
    {
      uint32_t nf[kChunk / 16][4], nd[kChunk / 16][4];
#pragma unroll
      for (int kb = 0; kb < kChunk / 16; ++kb) {
        const int c0 = 16 * kb + 2 * t4;
        const float2 d0 = *reinterpret_cast<const float2*>(decay + c0);
        const float2 d8 = *reinterpret_cast<const float2*>(decay + c0 + 8);
        a_fragment(nv_acc + 8 * kb, d0.x, d0.y, d8.x, d8.y, nd[kb]);
      }
      const float e_last = exp_gam[kChunk - 1];
#pragma unroll
      for (int i = 0; i < 64; ++i) s_acc[i] *= e_last;
      wgmma::fence(s_acc);
#pragma unroll
      for (int kb = 0; kb < kChunk / 16; ++kb) wgmma::mma_b_mn<T, kDim>(nd[kb], wgmma::mnmajor_desc(ks, 16 * kb), s_acc);
      wgmma::commit();
#pragma unroll
      for (int kb = 0; kb < kChunk / 16; ++kb) a_fragment(nv_acc + 8 * kb, 1.f, 1.f, 1.f, 1.f, nf[kb]);
      wgmma::fence(o_acc);
#pragma unroll
      for (int kb = 0; kb < kChunk / 16; ++kb) wgmma::mma_b_mn<T, kChunk>(nf[kb], wgmma::mnmajor_desc(pt, 16 * kb), o_acc);
      wgmma::commit();
      if (c > 0 && *sm_output_mode == kOutputRows) store_output_rows(c - 1, kChunk, false);  // chunk c − 1 was whole
      wgmma::wait<0>();
      wgmma::fence_operands(o_acc);
      wgmma::fence_operands(s_acc);
    }
    // This stage (q, k, v, gates, P, Tβ) is no longer read: the producer may refill it.
    named_arrive(kBarStageFree + stage, kThreads);
    FUSED_PHASE(5);

    // --- 4. O = scale Oᵀᵀ: o_acc[4 j + e] (value v0 + 16 wr + g + 8 (e / 2),
    // token 8 j + 2 t4 + e % 2) into the output tile; its rows in the sequence go
    // out by store_output_rows while the next chunk's last wgmmas run (after
    // the barrier below: every warp's part of the tile written). The tile has
    // two stages: chunk c + 2 writes this one after every thread of the
    // warpgroup passed chunk c + 1's barrier, i.e. finished reading it.
    if (const int mode = *sm_output_mode; mode != kOutputNone) {
      // stmatrix, transposed: the 8x8 blocks (tokens 8 j.., values 16 wr + 8 h..)
      // of n8 tiles j and j + 1, h = 0, 1; lane 8 m + r gives the address of
      // token row r of block m (j + m / 2, h = m % 2): in the padded tile, or
      // in the tensor stores' swizzled tile (a row's 16 bytes in one chunk).
      const int ln = lane_again(), m = ln >> 3;
      const bool tensor = mode == kOutputTensor;
      T* const row = tensor ? tensor_tile(stage).at(8 * (m >> 1) + (ln & 7), 16 * wr + 8 * (m & 1))
                            : sm_o + stage * kChunk * kLdO + (8 * (m >> 1) + (ln & 7)) * kLdO + v0 + 16 * wr + 8 * (m & 1);
      const int j_step = tensor ? 8 * (kDim / 2) : 8 * kLdO;  // elements from n8 tile j to j + 1's rows
#pragma unroll
      for (int j = 0; j < kChunk / 8; j += 2) {
        const float* o = o_acc + 4 * j;
        mma::stsm_x4_trans(row + j * j_step, M::pack(a.scale * o[0], a.scale * o[1]),
                           M::pack(a.scale * o[2], a.scale * o[3]), M::pack(a.scale * o[4], a.scale * o[5]),
                           M::pack(a.scale * o[6], a.scale * o[7]));
      }
      if (tensor) wgmma::fence_shared_for_async();  // the tile's writes before the TMA unit reads it
      named_sync(kBarOutput + (warp >> 2), 128);
      if (tensor && o_issuer() && (c + 1 < nc || sm_o_coords[3] == kChunk))
        tma::store_output_tile(&maps.o, tensor_tile(stage).base, v0, sm_o_coords[0] + c * kChunk, sm_o_coords[1],
                               sm_o_coords[2]);
    }
    FUSED_PHASE(6);
  }
  if (const int mode = *sm_output_mode; nc > 0 && mode != kOutputNone) {
    const int last_rows = sm_o_coords[3];
    if (mode == kOutputRows || last_rows < kChunk) store_output_rows(nc - 1, last_rows, mode == kOutputTensor);
    if (o_issuer() && mode == kOutputTensor) tma::wait_stores_done();
  }
  FUSED_PROFILE_END(n_chunks);

  const StateTarget final_state = *sm_final;
  if (final_state.ptr != nullptr) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int v = v0 + 16 * wr + g + ((i >> 1) & 1) * 8, k = 8 * (i >> 2) + 2 * t4 + (i & 1);
      final_state.store(k, v, s_acc[i]);
    }
  }
  unsigned* const signal = *sm_signal;
  if (signal != nullptr) {
    __threadfence();
    named_sync(kBarState, kStateThreads);  // every state thread's stores fenced
    if (tid == 0) add_release(signal, 1u);
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
  // q and k a 64-feature block a load (each block lands between the other's: the stage's [K; Q] tile).
  err = encode_token_tile_map(&maps.q, args.q, args.token_dtype, rows, args.T, args.H, args.q_sb, args.q_st, args.q_sh,
                              /*feature_blocks=*/1);
  if (err == cudaSuccess)
    err = encode_token_tile_map(&maps.k, args.k, args.token_dtype, rows, args.T, args.H, args.k_sb, args.k_st, args.k_sh,
                                /*feature_blocks=*/1);
  if (err == cudaSuccess)
    err = encode_token_tile_map(&maps.v, args.v, args.token_dtype, rows, args.T, args.HV, args.v_sb, args.v_st, args.v_sh);
  if (err != cudaSuccess) return err;
  // o by tensor stores where its layout allows (a map the driver refuses: by rows).
  maps.o_tensor = fused_output_tensor_storable(args) &&
                  encode_output_tile_map(&maps.o, args.o, args.o_dtype, rows, args.T, args.HV, args.o_sb, args.o_st,
                                         args.o_sh) == cudaSuccess;
  FLASHQLA_PLAN("gdn_fwd_fused_kernel: pass=%d grid=%lld block=%d smem=%d bytes (chunk %d, K=V=%d, piece %lld chunks)",
                args.piece_pass, (long long)blocks, kThreads, kSmemBytes, kChunk, kDim, (long long)args.piece_chunks);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  cudaLaunchAttribute programmatic{};
  programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  programmatic.val.programmaticStreamSerializationAllowed = 1;
  if (args.piece_pass == kPieceOutputs && args.programmatic_output_pass) {
    config.attrs = &programmatic;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, gdn_fwd_fused_kernel<T>, args, maps);
}

}  // namespace

cudaError_t launch_gdn_fwd_fused(const ForwardArgs& args, cudaStream_t stream) {
  return args.token_dtype == FLASHQLA_DTYPE_BFLOAT16 ? launch_typed<__nv_bfloat16>(args, stream)
                                                    : launch_typed<__half>(args, stream);
}

}  // namespace flashqla::cuda
