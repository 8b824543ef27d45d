// The tensor-core backward, step 2 of 3: the two serial chains, one CTA each
// per (sequence, value head, V tile of kVt = 32 or 16 columns), both directions
// in one launch (blockIdx.y 0: the gradient chain, the longer, started first). Each keeps
// its state slice in fp32 registers and stores it in bf16 at every chunk for
// step 3:
//   state      S entering each chunk:  Vd = U0 − W S,
//              S' = e^{γ_L} S + K̂ᵀ diag(e^{γ_L − γ}) Vd
//   gradient   dS leaving each chunk:  dVd = Z + diag(e^{γ_L − γ}) K̂ dS',
//              dS = e^{γ_L} dS' + D − Wᵀ dVd,  D = (scale diag(e^γ) Q̂)ᵀ dO
// and the gradient chain writes dS before the first chunk as d_initial_state.
//
// Warp-specialised: warps 4-7, the producer, prepare chunk ci + 1 while warps
// 0-3, the chain, run chunk ci; they meet once a chunk (three stages: chunk
// ci + 2's rows are in flight meanwhile).
//   producer  copies each chunk's rows by cp.async two chunks ahead; for the
//             gradient chain it forms D, the state-free term, and leaves it in
//             the stage (over q's rows, in the chain warps' fragment order);
//   chain     per chunk: the state slice to bf16 in shared memory (and from
//             there to the workspace by 16 bulk copies, one an 8-row block,
//             in the async proxy: no thread's later proxy fence, a CTA
//             memory barrier too, waits for them as it would for stores), the
//             64 x kVt product K dS' or W S, Vd or −dVd, then the state
//             update: the chain's whole serial path.
// The workspace keeps each (chunk, value head) state as a [128][128]
// mma::CoreTile (BackwardArgs::states), so that a CTA's kVt columns of an
// 8-row block are one contiguous run there as in its shared-memory slice.
// k and q are used as loaded: their l2norm factors (BackwardArgs::rows, from
// step 1 with the gates) scale the 64-row side instead, K̂ dS' = diag(r_k)(K dS')
// and K̂ᵀ diag(b) Vd = Kᵀ diag(r_k b) Vd; D takes q exact and
// diag(scale e^γ r_q) dO as bf16 hi + lo (FLA keeps e^γ q in fp32; in one
// bf16 rounding d_initial_state's error was 5× FLA's).
#include "cuda/sm90/gdn_bwd_tc_sm90.h"

#include "cuda/backward_chain_pieces.h"

#include "cuda/sm90/gdn_bwd_tc/common.cuh"
#include "cuda/sm90/tma_load.cuh"
#include "cuda/sm90/warp_specialization.cuh"
#include "cuda/sm90/warpgroup_mma.cuh"

namespace flashqla::cuda {
namespace {

using namespace bwd;

constexpr int kThreads = 256;
constexpr int kChainThreads = 128;  // warps 0-3; the producer is warps 4-7
constexpr int kStages = 3;  // chunk ci in stage ci % 3; its rows are copied from chunk ci − 2 on

// kVt value columns a CTA: 32, or 16 where 32 would leave most SMs idle (few
// (sequence, value head) chains: twice the CTAs, each chunk's step shorter).
template <int kVt>
struct Columns {
  static_assert(kVt == 16 || kVt == 32, "16 or 32 value columns a CTA");
  static constexpr int kLd = kVt + 8;          // 48- or 80-byte rows of the narrow row tiles
  static constexpr int kTiles = kDim / kVt;    // CTAs a (sequence, value head) and direction
  static constexpr int kDVecs = kVt / 4;       // D's float4s a thread (2 x kVt / 8 fragments of 4)
  static constexpr int kNT = kVt / 8;          // n-tiles of 8 columns
};

// Tiles the chain's wgmmas read: k and W as [64 tokens][128 keys] in the
// 128-byte swizzle (A operands: K-major for K dS' / W S, MN-major for
// Wᵀ dVd / Kᵀ Vd), the state slice [128 keys][kVt values] and Vd [64][kVt] in
// core matrices (MN-major B operands).
using WideTile = mma::Swizzled128Tile<bf16, kChunk>;
template <int kVt>
using NarrowTile = mma::CoreTile<bf16, kVt>;

// One chunk's inputs (q and dO: the gradient chain only).
template <int kVt>
struct ChainStage {
  static constexpr int kLdVt = Columns<kVt>::kLd, kDVecs = Columns<kVt>::kDVecs;
  bf16 k[kChunk * kDim], w[kChunk * kDim];  // WideTile each (1024-byte aligned)
  union {
    bf16 q[kChunk * kLdWide];          // q's rows, as loaded
    float4 d[kDVecs * kChainThreads];  // then D: [vector][chain thread]
  } qd;
  bf16 in[kChunk * kLdVt];   // U0 (state chain) or Z (gradient chain) columns
  bf16 dos[kChunk * kLdVt];  // dO columns, then diag(scale e^γ r_q) dO's hi part
  float4 rows[kChunk];       // BackwardArgs::rows; zero past the chunk's end
};

template <int kVt>
struct ChainSmem {
  static constexpr int kLdVt = Columns<kVt>::kLd;
  static_assert(sizeof(float4) * Columns<kVt>::kDVecs * kChainThreads == sizeof(float) * kDim * kVt,
                "D: 128 x kVt fp32");
  static_assert(sizeof(ChainStage<kVt>) % 1024 == 0, "each stage's swizzled tiles 1024-byte aligned");
  ChainStage<kVt> stage[kStages];
  bf16 dlo[kChunk * kLdVt];  // the producer's lo part of diag(scale e^γ r_q) dO
  bf16 st[kDim * kVt];       // NarrowTile: the state slice in bf16, the B operand of W S / K dS'
  bf16 vd[kChunk * kVt];     // NarrowTile: diag(r_k b) Vd (state chain) or −dVd (gradient chain)
  uint64_t hand_over;        // the chunks' hand-over (an mbarrier of all kThreads threads)
};
template <int kVt>
constexpr size_t kSmemBytes = sizeof(ChainSmem<kVt>) + 1024;  // room to align the base to 1024 bytes

using ChainWarps = ws::NamedBarrier<1, 1, kChainThreads>;
using ProducerWarps = ws::NamedBarrier<2, 1, kThreads - kChainThreads>;
static_assert(ws::named_barriers_disjoint<ChainWarps, ProducerWarps>(), "the chains' named barriers overlap");
// Chunk ci's hand-over (ChainSmem::hand_over, use ci): its stage is ready
// (producer) and chunk ci − 1's stage is free and the state slice stored (chain).
// Both sides wait: the producer is never more than a chunk ahead.
__device__ __forceinline__ void hand_over(uint64_t* bar, int64_t ci) {
  ws::mbarrier_arrive_and_wait(bar, static_cast<uint32_t>(ci) & 1u);
}

__device__ __forceinline__ int next_stage(int stage) { return stage == kStages - 1 ? 0 : stage + 1; }

// kBeside: the grads kernel runs beside the chains (BackwardArgs::chain_progress
// set); the kernel without it is the chains alone.
template <int kVt, bool kBeside>
__global__ void __launch_bounds__(kThreads, 1) gdn_bwd_tc_chain_kernel(const BackwardArgs a) {
  constexpr int kLdVt = Columns<kVt>::kLd, kTiles = Columns<kVt>::kTiles, kDVecs = Columns<kVt>::kDVecs;
  constexpr int kNT = Columns<kVt>::kNT;
  using Stage = ChainStage<kVt>;
  using Smem = ChainSmem<kVt>;
  using Narrow = NarrowTile<kVt>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The base aligned to 1024 bytes by an offset, so the compiler keeps shared
  // addressing (LDS/STS, not generic loads and stores).
  const uint32_t misaligned = mma::smem_addr(smem_raw) % 1024;
  Smem& s = *reinterpret_cast<Smem*>(smem_raw + (misaligned ? 1024 - misaligned : 0));
  const ForwardArgs& f = a.f;
  // blockIdx.x: (V tile, value head, sequence piece j, sequence) from the fastest.
  const int64_t v0 = (int64_t(blockIdx.x) % kTiles) * kVt;
  const int64_t hv = (int64_t(blockIdx.x) / kTiles) % f.HV, nj = int64_t(blockIdx.x) / kTiles / f.HV;
  const int64_t pieces_grid = a.piece_chunks > 0 ? a.max_pieces : 1;
  const int64_t n = nj / pieces_grid, piece = nj % pieces_grid;
  const int64_t h = hv / f.group;
  const int role = blockIdx.y;
  const bool grad = role == 0;
  const bool varlen = f.cu_seqlens != nullptr;
  const SequenceRange seq = sequence_range(f.cu_seqlens, f.cu_seqlens_int64, f.T, n);
  const int64_t n_chunks = (seq.eos - seq.bos + kChunk - 1) / kChunk;
  const ChainRun run = plan_chain_run(a, role, piece, n_chunks, seq.eos - seq.bos);
  if (!run.active) return;  // the whole CTA: before any barrier
  const int64_t n_run = run.c_end - run.c_begin;
  const int tid = threadIdx.x, lane = tid % 32;
  const int warp = __shfl_sync(0xffffffffu, tid / 32, 0);  // uniform in ptxas's view
  auto chunk_at = [&](int64_t ci) { return grad ? run.c_end - 1 - ci : run.c_begin + ci; };
  // The grads kernel beside the chains (BackwardArgs::chain_progress) starts once
  // every chain CTA has started, so none of its waits can hold a chain CTA back;
  // this CTA's count of chunks whose states are stored is raised after each
  // hand-over (by the producer: before it, the chain's lanes that copied chunk
  // ci − 1's slice waited for their copies' writes) and at the end (by the
  // chain, after the last).
  if constexpr (kBeside) allow_dependent_grids();
  unsigned* const progress = kBeside ? a.chain_progress + blockIdx.y * gridDim.x + blockIdx.x : nullptr;
  if (tid == 0) {
    tma::barrier_init(&s.hand_over, kThreads);
    tma::fence_barrier_init();
  }
  __syncthreads();

  if (warp >= 4) {  // ---- producer ----
    const int pt = tid - kChainThreads, pw = warp - 4;
    const RowCopy<kThreads - kChainThreads, kDim> wide(pt);
    const RowCopy<kThreads - kChainThreads, kVt> narrow(pt);
    const bf16* const k_base = static_cast<const bf16*>(f.k) + seq.row * f.k_sb + h * f.k_sh;
    const bf16* const q_base = static_cast<const bf16*>(f.q) + seq.row * f.q_sb + h * f.q_sh;
    const bf16* const do_base = static_cast<const bf16*>(a.d_o) + seq.row * a.do_sb + hv * a.do_sh + v0;
    const bf16* const w_base = reinterpret_cast<const bf16*>(a.w);
    const bf16* const in_base = reinterpret_cast<const bf16*>(grad ? a.z : a.u0) + v0;
    auto issue_loads = [&](int64_t ci, Stage& g) {
      const int64_t t0 = seq.bos + chunk_at(ci) * kChunk;
      const int L = int(min64(kChunk, seq.eos - t0));
      const int64_t tok = token_index(seq.row, t0, f.T, hv, f.HV, kDim);
      wide.issue(WideTile{g.k}, k_base + t0 * f.k_st, f.k_st, L);
      wide.issue(WideTile{g.w}, w_base + tok, f.HV * kDim, L);
      narrow.issue(Tile{g.in, kLdVt}, in_base + tok, f.HV * kDim, run.zero_in ? 0 : L);  // zero: the transition
      if (pt < kChunk) {
        const float4* const src = a.rows + tok / kDim;
        copy_async_16(&g.rows[pt], pt < L ? src + pt * f.HV : src, pt < L);
      }
      if (grad) {
        wide.issue(Tile{g.qd.q, kLdWide}, q_base + t0 * f.q_st, f.q_st, L);
        narrow.issue(Tile{g.dos, kLdVt}, do_base + t0 * a.do_st, a.do_st, L);
      }
    };
    for (int i = 0; i < kStages - 1; ++i) {
      if (i < n_run) issue_loads(i, s.stage[i]);
      commit_async_copies();
    }
    int stage = 0;  // ci % kStages
    for (int64_t ci = 0; ci < n_run; ++ci) {
      Stage& g = s.stage[stage];
      wait_async_copies_but<kStages - 2>();  // this thread's copies of chunk ci
      if (grad) {
        ProducerWarps::sync();  // everyone's copies of chunk ci
        const Tile dhi{g.dos, kLdVt}, dlo{s.dlo, kLdVt}, q{g.qd.q, kLdWide};
        for (int i = pt; i < kChunk * kVt / 2; i += kThreads - kChainThreads) {
          const int r = i / (kVt / 2), col = 2 * (i % (kVt / 2));
          const float sq = g.rows[r].y;  // zero past the chunk's end
          const float2 x = Mma::unpack(*reinterpret_cast<const uint32_t*>(dhi.at(r, col)));
          const uint32_t hi = Mma::pack(sq * x.x, sq * x.y);
          const float2 h2 = Mma::unpack(hi);
          *reinterpret_cast<uint32_t*>(dhi.at(r, col)) = hi;
          store_pair(dlo, r, col, sq * x.x - h2.x, sq * x.y - h2.y);
        }
        ProducerWarps::sync();
        // D's rows as the chain warpgroup's accumulators hold them: block b,
        // rows 64 b + 16 w .. 64 b + 16 w + 15 (w the chain warp = pw).
        float d[2][1][kNT][4];
        zero(d[0]);
        zero(d[1]);
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          warp_gemm<1, kNT, true, false, kChunk / 16>(d[b], q, dhi, 64 * b + 16 * pw, 0, kChunk);
          warp_gemm<1, kNT, true, false, kChunk / 16>(d[b], q, dlo, 64 * b + 16 * pw, 0, kChunk);
        }
        ProducerWarps::sync();  // q read: D goes over it
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int j = 0; j < kNT; ++j) {
            g.qd.d[(kNT * b + j) * kChainThreads + 32 * pw + lane] =
                make_float4(d[b][0][j][0], d[b][0][j][1], d[b][0][j][2], d[b][0][j][3]);
          }
      }
      wgmma::fence_shared_for_async();  // the stage's rows, seen by the chain's wgmmas
      hand_over(&s.hand_over, ci);
      if (kBeside && pt == 0 && ci > 0) max_release(progress, static_cast<unsigned>(ci));
      // Chunk ci + 2 into the stage chunk ci − 1 used: the chain is done with it.
      if (ci + kStages - 1 < n_run) issue_loads(ci + kStages - 1, s.stage[stage == 0 ? kStages - 1 : stage - 1]);
      commit_async_copies();
      stage = next_stage(stage);
    }
    return;
  }

  // ---- chain: one warpgroup, the state slice in wgmma accumulators ----
  // S[b][4 j + e]: key row 64 b + 16 w + g + 8 (e / 2), value column 8 j + 2 t + e % 2
  // (w the warp, g = lane / 4, t = lane % 4).
  const Narrow vd{s.vd};
  float S[2][4 * kNT];
  auto for_each_state = [&](auto f) {
    const int g8 = lane / 4, t4 = lane % 4;
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          f(64 * b + 16 * warp + g8 + 8 * hh, 8 * j + 2 * t4, S[b][4 * j + 2 * hh], S[b][4 * j + 2 * hh + 1]);
        }
  };
  if (run.init == ChainRun::kFromZero || run.init == ChainRun::kFromIdentity) {
    const bool identity = run.init == ChainRun::kFromIdentity;  // the transition's columns v0 .. v0 + kVt − 1
    for_each_state([&](int r, int c, float& x0, float& x1) {
      x0 = identity && r == v0 + c ? 1.f : 0.f;
      x1 = identity && r == v0 + c + 1 ? 1.f : 0.f;
    });
  } else if (run.init == ChainRun::kFromPiece) {  // the scan's fp32 start state
    const float* const src = piece_state(a, n, piece, hv, run.init_kind) + v0;
    for_each_state([&](int r, int c, float& x0, float& x1) {
      const float2 x = *reinterpret_cast<const float2*>(src + r * kDim + c);
      x0 = x.x, x1 = x.y;
    });
  } else {  // S from h0 (state chain) or dS from dht (gradient chain), zero without
    const void* src = grad ? a.dht : f.h0;
    const flashqla_dtype_t dtype = grad ? a.dht_dtype : f.h0_dtype;
    const int64_t sn = grad ? a.dht_sn : f.h0_sn, sh = grad ? a.dht_sh : f.h0_sh;
    const int64_t s2 = grad ? a.dht_s2 : f.h0_s2, s3 = grad ? a.dht_s3 : f.h0_s3;
    for_each_state([&](int r, int c, float& x0, float& x1) {
      x0 = src ? load_float(src, dtype, state_offset(n, hv, r, v0 + c, sn, sh, s2, s3, f.state_v_first)) : 0.f;
      x1 = src ? load_float(src, dtype, state_offset(n, hv, r, v0 + c + 1, sn, sh, s2, s3, f.state_v_first)) : 0.f;
    });
  }
  uint16_t* const states = grad ? a.dstates : a.states;
  int stage = 0;
  for (int64_t ci = 0; ci < n_run; ++ci) {
    Stage& g = s.stage[stage];
    const int64_t c = chunk_at(ci);
    const Narrow st{s.st};
    if (kBeside && lane < 4 && ci > 0) {  // chunk ci − 1's slice written, then counted after the hand-over
      asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
      asm volatile("fence.proxy.async.global;\n" ::: "memory");
    }
    for_each_state([&](int r, int col, float& x0, float& x1) { store_pair(st, r, col, x0, x1); });
    wgmma::fence_shared_for_async();
    hand_over(&s.hand_over, ci);  // chunk ci's stage, and the state slice from every chain warp
    // The state slice to the workspace: lane b < 4 of each chain warp copies
    // 8-row block 4 w + b (kVt · 16 contiguous bytes on both sides; st was
    // made visible to the async proxy before the hand-over). Read by the
    // barrier after the first product (each lane waits for its copy's reads before it).
    if (lane < 4 && run.store_chunks) {
      const int b = 4 * warp + lane;
      uint16_t* const gs = states + (chunk_slot(n, c, seq.bos, f.T, varlen) * f.HV + hv) * kDim * kDim +
                           b * (kDim * 8) + (v0 / 8) * 64;
      asm volatile(
          "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n"
          "cp.async.bulk.commit_group;\n" ::"l"(gs),
          "r"(mma::smem_addr(st.base + b * (kVt * 8))), "n"(kVt * 8 * 2)
          : "memory");
    }
    const Tile in{g.in, kLdVt};
    float el;
    float4 dvec[kDVecs];  // D's rows of this thread (gradient chain)
    {  // the 64 x kVt chunk product K dS' or W S (m64nKvt, A K-major, B the state slice MN-major)
      float y[4 * kNT];
#pragma unroll
      for (int i = 0; i < 4 * kNT; ++i) y[i] = 0.f;
      const WideTile lhs{grad ? g.k : g.w};
      wgmma::fence(y);
#pragma unroll
      for (int k0 = 0; k0 < kDim; k0 += 16) {
        wgmma::mma_ss<bf16, kVt, wgmma::kK, wgmma::kMN>(wgmma::kmajor_desc(lhs, k0), wgmma::mnmajor_desc(st, k0), y);
      }
      wgmma::commit();
      // While it runs, what does not need it: this thread's e^{γ_L}, D, U0 / Z
      // pairs and row factors from the stage into registers. (S itself waits:
      // ptxas holds registers a wgmma once wrote until no wgmma is in flight.)
      el = g.rows[0].z;
      if (grad) {
#pragma unroll
        for (int i = 0; i < kDVecs; ++i) dvec[i] = g.qd.d[i * kChainThreads + tid];
      }
      const int g8 = lane / 4, t4 = lane % 4;
      uint32_t base[kNT][2];
      float f0[2];
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = 16 * warp + g8 + 8 * hh;
        f0[hh] = g.rows[r].x;  // e^{γ_L − γ} r_k, zero past the chunk's end
#pragma unroll
        for (int j = 0; j < kNT; ++j) base[j][hh] = *reinterpret_cast<const uint32_t*>(in.at(r, 8 * j + 2 * t4));
      }
      wgmma::wait<0>();
      wgmma::fence_operands(y);
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int r = 16 * warp + g8 + 8 * hh, col = 8 * j + 2 * t4;
          const float x0 = y[4 * j + 2 * hh], x1 = y[4 * j + 2 * hh + 1];
          const float2 in2 = Mma::unpack(base[j][hh]);
          if (grad) {  // −dVd = −(Z + b r_k K dS')
            store_pair(vd, r, col, -(in2.x + f0[hh] * x0), -(in2.y + f0[hh] * x1));
          } else {  // r_k b (U0 − W S)
            store_pair(vd, r, col, f0[hh] * (in2.x - x0), f0[hh] * (in2.y - x1));
          }
        }
    }
    wgmma::fence_shared_for_async();
    // S' = e^{γ_L} S (+ D), before the other chain warps' Vd is in.
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const float4 dv = grad ? dvec[kNT * b + j] : make_float4(0.f, 0.f, 0.f, 0.f);
        S[b][4 * j + 0] = el * S[b][4 * j + 0] + dv.x;
        S[b][4 * j + 1] = el * S[b][4 * j + 1] + dv.y;
        S[b][4 * j + 2] = el * S[b][4 * j + 2] + dv.z;
        S[b][4 * j + 3] = el * S[b][4 * j + 3] + dv.w;
      }
    if (lane < 4) asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");  // the bulk copies have read st
    ChainWarps::sync();  // vd in; st read
    {  // S += Wᵀ (−dVd) or Kᵀ (r_k b Vd): two m64nKvt, A MN-major (the tile's keys), B vd MN-major
      const WideTile upd{grad ? g.w : g.k};
      wgmma::fence_operands(S[0]);
      wgmma::fence(S[1]);
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int k0 = 0; k0 < kChunk; k0 += 16) {
          wgmma::mma_ss<bf16, kVt, wgmma::kMN, wgmma::kMN>(wgmma::mnmajor_desc(upd, k0, 64 * b),
                                                           wgmma::mnmajor_desc(vd, k0), S[b]);
        }
      wgmma::commit_and_wait();
      wgmma::fence_operands(S[0]);
      wgmma::fence_operands(S[1]);
    }
    stage = next_stage(stage);
  }
  if (lane < 4) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");  // the last state slices written
  if constexpr (kBeside) {
    if (lane < 4) asm volatile("fence.proxy.async.global;\n" ::: "memory");
    ChainWarps::sync();  // every chain warp's copies of the last chunk's states
    if (tid == 0) max_release(progress, static_cast<unsigned>(n_run));
  }
  if (run.end == ChainRun::kToPiece) {  // fp32, for the scan (or the next pass)
    float* const dst = piece_state(a, n, run.end_piece, hv, run.end_kind) + v0;
    for_each_state([&](int r, int c, float& x0, float& x1) {
      *reinterpret_cast<float2*>(dst + r * kDim + c) = make_float2(x0, x1);
    });
  }
  if (run.end == ChainRun::kDh0 && a.dh0 != nullptr) {
    for_each_state([&](int r, int c, float& x0, float& x1) {
      store_float(a.dh0, a.dh0_dtype,
                  state_offset(n, hv, r, v0 + c, a.dh0_sn, a.dh0_sh, a.dh0_s2, a.dh0_s3, f.state_v_first), x0);
      store_float(a.dh0, a.dh0_dtype,
                  state_offset(n, hv, r, v0 + c + 1, a.dh0_sn, a.dh0_sh, a.dh0_s2, a.dh0_s3, f.state_v_first), x1);
    });
  }
}

template <int kVt, bool kBeside>
cudaError_t launch_chains(const BackwardArgs& args, cudaStream_t stream) {
  constexpr size_t smem = kSmemBytes<kVt>;
  cudaError_t err = cudaFuncSetAttribute(gdn_bwd_tc_chain_kernel<kVt, kBeside>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const bool pieces = args.piece_chunks > 0;
  const int64_t blocks = Columns<kVt>::kTiles * args.f.HV * args.f.N * (pieces ? args.max_pieces : 1);
  if (blocks == 0) return cudaSuccess;
  // Pass 1 of sequence pieces also runs the transitions (blockIdx.y 2).
  const unsigned roles = pieces && args.chain_pass == 1 ? 3 : 2;
  gdn_bwd_tc_chain_kernel<kVt, kBeside><<<dim3(static_cast<unsigned>(blocks), roles), kThreads, smem, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gdn_bwd_tc_chains(const BackwardArgs& args, int value_columns, cudaStream_t stream) {
  const bool beside = args.chain_progress != nullptr;
  if (value_columns == 16) return beside ? launch_chains<16, true>(args, stream) : launch_chains<16, false>(args, stream);
  if (value_columns == 32) return beside ? launch_chains<32, true>(args, stream) : launch_chains<32, false>(args, stream);
  return cudaErrorInvalidValue;
}

}  // namespace flashqla::cuda
