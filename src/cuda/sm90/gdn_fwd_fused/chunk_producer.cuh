// The fused forward's chunk producer (warpgroup 2): for each chunk, one ahead
// of the state chain, the TMA loads of q, k and v, the gate vectors, K Kᵀ and
// K Qᵀ on wgmma, their decayed epilogues (A, Pᵀ and L_10), the two 32x32
// diagonal blocks of T = (I + A)⁻¹ times β, and the hand-over to the state
// warpgroups. Steps named after the algebra of docs/design.md.
//
// The steps are functions a second kernel can call (the loads, the rows'
// preparation, the gates, K [K; Q]ᵀ, the decayed epilogues); run_chunk_producer
// composes them in the order the kernel was tuned in, and keeps the two levels of
// the inverse inline in its chunk loop. Each step was moved out only where the
// kernel's instructions stayed the same, in the same order: the producer is on
// the kernel's critical path, and its schedule is part of its speed (as member
// functions of a producer object the same steps ran 1% slower at full load;
// the inverse's levels as functions, even as immediately invoked lambdas,
// reorder the gate loads; docs/perf.md, "What was tried").

#pragma once

#include <type_traits>

#include "cuda/forward_args.h"
#include "cuda/sm90/device_common.cuh"
#include "cuda/sm90/gdn_fwd_fused/kernel_layout.cuh"
#include "cuda/sm90/tma_load.cuh"
#include "cuda/sm90/unit_lower_inverse.cuh"
#include "cuda/sm90/warp_mma.cuh"
#include "cuda/sm90/warpgroup_mma.cuh"

namespace flashqla::cuda::fused_fwd {

// 2^x where keep, else 0, without a branch: the exponent is selected (−∞ where
// masked), so masked entries never overflow and the epilogues over the
// accumulators stay straight-line code. The epilogues pass differences of
// γ log2(e) (the gate stage holds γ so scaled): e^{γ_i − γ_j}. ex2.approx with
// denormal results flushed to zero (no range fix-up around the MUFU, as __expf
// has), 2^{−∞} = 0.
__device__ __forceinline__ float masked_exp2(bool keep, float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(keep ? x : -INFINITY));
  return y;
}
constexpr float kLog2e = 1.4426950408889634f;

// Chunk c's k (its two 64-feature boxes, with the stage barrier's byte count for
// both tensors) or q (its two boxes) into the stage's [K; Q] tile by TMA: each
// 64-feature column block holds k's rows, then q's. One thread; `token` is the
// chunk's first token.
template <typename Element>
__device__ __forceinline__ void load_qk_half(SharedStorage<Element>& s, const TokenMaps& maps, int64_t c, bool k_part,
                                             int token, int head, int row) {
  uint64_t* const bar = s.qk_loaded + QKPipeline::of(c).index;
  if (k_part) tma::arrive_expect_bytes(bar, 2 * kChunk * kDim * int(sizeof(Element)));
  const auto t = k_part ? s.k_tile(c) : s.q_tile(c);
#pragma unroll
  for (int b = 0; b < 2; ++b) tma::load_token_tile(t.at(0, 64 * b), k_part ? &maps.k : &maps.q, bar, token, head, row, b);
}

// A chunk's v into hand-over stage `stage` by TMA (one thread).
template <typename Element>
__device__ __forceinline__ void load_v_tile(SharedStorage<Element>& s, const TokenMaps& maps, int stage, int token,
                                            int head, int row) {
  uint64_t* const bar = s.v_loaded + stage;
  tma::arrive_expect_bytes(bar, kChunk * kDim * int(sizeof(Element)));
  tma::load_token_tile(s.v_tile(stage).base, &maps.v, bar, token, head, row);
}

// Rows of a landed [64 tokens][128] token tile, by the producer warpgroup (warp
// pwarp: row blocks pwarp and pwarp + 4; lane: row lane % 8, 16-byte segments
// lane / 8 + 4 s of it, conflict-free): rows >= rows_in zeroed (past a packed
// sequence's end they hold the next sequence's tokens), the others scaled to
// x · rsqrt(Σx² + 1e-6) where normalize (q/k l2norm).
template <typename Element, typename Tile>
__device__ __forceinline__ void prepare_token_rows(Tile tile, int rows_in, bool normalize, int pwarp, int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = (pwarp + 4 * half) * 8 + (lane & 7);
    uint4* seg[4];
#pragma unroll
    for (int s4 = 0; s4 < 4; ++s4) seg[s4] = reinterpret_cast<uint4*>(tile.at(r, 8 * ((lane >> 3) + 4 * s4)));
    if (r >= rows_in) {
#pragma unroll
      for (int s4 = 0; s4 < 4; ++s4) *seg[s4] = make_uint4(0u, 0u, 0u, 0u);
    }
    if (!normalize) continue;
    uint4 raw[4];
    float ss = 0.f;
#pragma unroll
    for (int s4 = 0; s4 < 4; ++s4) {
      raw[s4] = *seg[s4];
      const Element* e = reinterpret_cast<const Element*>(&raw[s4]);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += float(e[i]) * float(e[i]);
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 8);
    ss += __shfl_xor_sync(0xffffffffu, ss, 16);
    const float rs = rsqrtf(ss + 1e-6f);
#pragma unroll
    for (int s4 = 0; s4 < 4; ++s4) {
      Element* e = reinterpret_cast<Element*>(&raw[s4]);
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = Element(float(e[i]) * rs);
      *seg[s4] = raw[s4];
    }
  }
}

// Raw bits of g and β at rows 2 lane and 2 lane + 1 of a chunk (one warp; the
// chunk's first token `first`, rows_in of its rows in the sequence: rows past
// them read a valid row, zeroed where converted), loaded a chunk ahead so their
// latency hides behind other work: converted only where used (a conversion next
// to the load would stall the warp for the global load's latency).
__device__ __forceinline__ void load_gate_bits(const ForwardArgs& a, int64_t row, int64_t hv, int64_t first,
                                               int rows_in, int lane, uint32_t (&g_bits)[2], uint32_t (&b_bits)[2]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = 2 * lane + j;
    const int64_t t = first + (r < rows_in ? r : 0);
    g_bits[j] = load_raw(a.g, a.g_dtype, row * a.g_sb + t * a.g_st + hv);
    b_bits[j] = load_raw(a.beta, a.beta_dtype, row * a.beta_sb + t * a.beta_st + hv);
  }
}

// g and the activated β of rows 2 lane and 2 lane + 1 from their raw bits (0
// past rows_in).
__device__ __forceinline__ void gates_from_bits(const ForwardArgs& a, const uint32_t (&g_bits)[2],
                                                const uint32_t (&b_bits)[2], int rows_in, int lane, float (&g)[2],
                                                float (&beta)[2]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const bool in = 2 * lane + j < rows_in;
    g[j] = in ? raw_to_float(g_bits[j], a.g_dtype) : 0.f;
    beta[j] = in ? activate_beta(raw_to_float(b_bits[j], a.beta_dtype), a.beta_activation) : 0.f;
  }
}

// A chunk's gate vectors (one warp, rows 2 lane and 2 lane + 1): γ = the
// inclusive in-chunk cumsum of g, stored as γ log2(e) (what the epilogues'
// exponentials take), e^γ and e^{γ_C − γ} (γ_C: the chunk's last γ; rows past
// the end add g = 0), and β.
__device__ __forceinline__ void store_gate_vectors(const float (&g)[2], const float (&beta)[2], int lane,
                                                   float* gamma_log2e, float* exp_gamma, float* decay,
                                                   float* beta_out) {
  const float pair = g[0] + g[1];
  float incl = pair;
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const float y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  const float g0 = incl - pair + g[0], g1 = incl;
  const float g_last = __shfl_sync(0xffffffffu, incl, 31);
  gamma_log2e[2 * lane] = g0 * kLog2e;
  gamma_log2e[2 * lane + 1] = g1 * kLog2e;
  exp_gamma[2 * lane] = __expf(g0);
  exp_gamma[2 * lane + 1] = __expf(g1);
  decay[2 * lane] = __expf(g_last - g0);
  decay[2 * lane + 1] = __expf(g_last - g1);
  beta_out[2 * lane] = beta[0];
  beta_out[2 * lane + 1] = beta[1];
}

// K [K; Q]ᵀ of chunk c (wgmma m64n128, A = K, B = the stage's [K; Q], both
// K-major) into acc, by the producer warpgroup: n8 tiles ..7 K Kᵀ, 8.. K Qᵀ = Pᵀ
// before its decay; committed, not waited for. First waits for the chunk's q and
// k, zeroes their rows past rows_in and applies the l2norm (then a producer
// barrier: every warp's rows before the wgmmas read them).
template <typename Element>
__device__ __forceinline__ void issue_key_products(SharedStorage<Element>& s, int64_t c, int rows_in, bool l2norm,
                                                   int pwarp, int lane, float (&acc)[kChunk]) {
  const QKPipeline qk = QKPipeline::of(c);
  tma::wait(s.qk_loaded + qk.index, qk.phase);  // Q(c), K(c)
  if (rows_in < kChunk || l2norm) {
    prepare_token_rows<Element>(s.k_tile(c), rows_in, l2norm, pwarp, lane);
    prepare_token_rows<Element>(s.q_tile(c), rows_in, l2norm, pwarp, lane);
    wgmma::fence_shared_for_async();  // Q and K are wgmma operands
    ProducerBarrier::sync();
  }
#pragma unroll
  for (int i = 0; i < kChunk; ++i) acc[i] = 0.f;
  wgmma::fence(acc);
  const auto kt = s.k_tile(c);  // A: its rows ..63 (K); B: all 128 ([K; Q])
#pragma unroll
  for (int k = 0; k < kDim / 16; ++k)
    wgmma::mma_ss<Element, 2 * kChunk, wgmma::kK, wgmma::kK>(wgmma::kmajor_desc(kt, 16 * k),
                                                             wgmma::kmajor_desc(kt, 16 * k), acc);
  wgmma::commit();
}

// The decayed epilogues of K Kᵀ and K Qᵀ, one pass over warp kWarp's 16 token
// rows i (the warp index a compile-time constant: each warp's code knows which
// of its column tiles hold what). One exponential a position (i, j), shared by the
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
// gate_col: γ log2(e) of this thread's columns (8 j + 2 lane_in_group, + 1),
// gate_row of its two rows, beta_row their β; pt and tb the stage's P and Tβ
// tiles, t_fp32 T's fp32 tile.
template <int kWarp, typename Element>
__device__ __forceinline__ void decay_key_products(const float (&acc)[kChunk], const float2 (&g_col)[kChunk / 8],
                                                   const float (&g_row)[2], const float (&b_row)[2], int lane_group,
                                                   int lane_in_group, const mma::CoreTile<Element, kChunk>& pt,
                                                   const mma::CoreTile<Element, kChunk>& tb, float* const& t_fp32) {
  using M = mma::Mma<Element>;
  constexpr int kDiag = 4 * (kWarp / 2);                  // the diagonal block's first column tile
  constexpr int kQuarter = kWarp < 2 ? 6 - 2 * kWarp : 2 * (kWarp - 2);  // the quarter's
  constexpr bool kSymmetric = kWarp < 2;
  constexpr int kBelow = 2 * kWarp + 2;  // column tiles >= this are above every row of the warp
  constexpr int kFirstP = 2 * kWarp;     // column tiles < this are left of every row of the warp
  const float* const acc_p = acc + kChunk / 2;  // Pᵀ's n8 tiles
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = 16 * kWarp + lane_group + 8 * half;
#pragma unroll
    for (int j = 0; j < kChunk / 8; ++j) {
      const int col = 8 * j + 2 * lane_in_group;
      const float e0 = masked_exp2(true, col < i ? g_row[half] - g_col[j].x : g_col[j].x - g_row[half]);
      const float e1 = masked_exp2(true, col + 1 < i ? g_row[half] - g_col[j].y : g_col[j].y - g_row[half]);
      if (j >= kFirstP)
        *reinterpret_cast<uint32_t*>(pt.at(i, col)) =
            M::pack(col >= i ? acc_p[4 * j + 2 * half] * e0 : 0.f,
                    col + 1 >= i ? acc_p[4 * j + 2 * half + 1] * e1 : 0.f);
      if (kSymmetric && j >= kQuarter && j < kQuarter + 2) {
        // (K Kᵀ)[i][col] is L's entry at row col (>= 32 > i), column i.
        *tb.at(col, i) = Element(acc[4 * j + 2 * half] * e0);
        *tb.at(col + 1, i) = Element(acc[4 * j + 2 * half + 1] * e1);
      }
      // A's entries above the warp's rows are never read (in the
      // diagonal block's lower-left quadrant, transposed, unused).
      if (j >= kBelow) continue;
      if (j >= kDiag && j < kDiag + 4) {
        t_fp32[col * kLdF + i] = col < i ? acc[4 * j + 2 * half] * b_row[half] * e0 : 0.f;
        t_fp32[(col + 1) * kLdF + i] = col + 1 < i ? acc[4 * j + 2 * half + 1] * b_row[half] * e1 : 0.f;
      }
      if (!kSymmetric && j >= kQuarter && j < kQuarter + 2)
        *reinterpret_cast<uint32_t*>(tb.at(i, col)) =
            M::pack(acc[4 * j + 2 * half] * e0, acc[4 * j + 2 * half + 1] * e1);
    }
  }
}

// Runs the producer warpgroup of a work item: pwarp is the warp in the
// warpgroup, [bos, eos) the item's tokens (bos its first), n_chunks its chunks.
template <typename Element>
__device__ __forceinline__ void run_chunk_producer(SharedStorage<Element>& s, const ForwardArgs& a,
                                                   const TokenMaps& maps, const WorkItem& item, int pwarp, int lane,
                                                   int bos, int eos, int64_t n_chunks) {
  using M = mma::Mma<Element>;
  using OperandTile = typename SharedStorage<Element>::OperandTile;
  constexpr int kKStages = kQKStages;
  const int tid = threadIdx.x;
  const int64_t hv = item.hv, h = hv / a.group, row = item.seq.row;
  auto k_tile = [&](int64_t c) { return s.k_tile(c); };
  auto q_tile = [&](int64_t c) { return s.q_tile(c); };
  auto v_tile = [&](int stage) { return s.v_tile(stage); };
  auto p_tile = [&](int stage) { return s.p_tile(stage); };
  auto tb_tile = [&](int stage) { return s.t_beta_tile(stage); };
  auto chunk_rows = [&](int64_t c) { return int(min64(kChunk, int64_t(eos - bos) - c * kChunk)); };
  float* const t_fp32_tile = s.inverse.t;  // T, [64][kLdF]
  float* const sm_gamma = &s.gates.gamma[0][0];
  float* const sm_exp_gamma = &s.gates.exp_gamma[0][0];
  float* const sm_decay = &s.gates.decay[0][0];
  float* const sm_beta = &s.gates.beta[0][0];
  uint64_t* const bar_k = s.qk_loaded;  // q and k of a stage
  uint64_t* const bar_qv = s.v_loaded;  // v of a stage
  // The first lanes of warps 0, 1 and 2 issue a chunk's loads (k, q and v:
  // TMA, a few boxes each; chunk 0's q and k the loader thread, warp 0's),
  // every producer thread waits for them on the stage's barrier. Chunk c's q
  // and k stage is c % 3 (its (c / 3)-th use), its v stage c % 2 (its
  // (c / 2)-th use).
  const bool loader = tid == kStateThreads;
  const int head_qk = int(h), head_v = int(hv), brow = int(row);
  auto load_qk_part = [&](int64_t c, bool k_part) {
    load_qk_half(s, maps, c, k_part, int(bos + c * kChunk), head_qk, brow);
  };
  auto load_v = [&](int64_t c, int stage) {  // only where item.read_v
    load_v_tile(s, maps, stage, int(bos + c * kChunk), head_v, brow);
  };
  auto prepare_rows = [&](auto tile, int rows_in, bool normalize) {
    prepare_token_rows<Element>(tile, rows_in, normalize, pwarp, lane);
  };
  auto load_gates = [&](int64_t c, uint32_t (&gr)[2], uint32_t (&br)[2]) {
    load_gate_bits(a, row, hv, int64_t(bos) + c * kChunk, chunk_rows(c), lane, gr, br);
  };
  // Chunk cc's gate vectors from the raw bits loaded before, then chunk cc + 1's
  // loads: warp 2, for chunk c + 1 while warps 0 and 3 finish chunk c's 32x32
  // diagonal blocks of T.
  uint32_t g_next[2] = {}, b_next[2] = {};
  auto compute_gates = [&](int64_t cc) {
    float gr[2], br[2];
    gates_from_bits(a, g_next, b_next, chunk_rows(cc), lane, gr, br);
    if (cc + 1 < n_chunks) load_gates(cc + 1, g_next, b_next);
    const int gs = int(cc % kKStages) * kChunk, bs = int(cc & 1) * kChunk;
    store_gate_vectors(gr, br, lane, sm_gamma + gs, sm_exp_gamma + gs, sm_decay + gs, sm_beta + bs);
  };
  if (pwarp == 2 && n_chunks > 0) {  // chunk 0's before the loop (the barrier below orders them)
    load_gates(0, g_next, b_next);
    compute_gates(0);
  }
  // P's and Tβ's two stages (adjacent) zeroed once: Pᵀ's column tiles left of
  // each warp's rows and the upper-right 16x16 quadrants of Tβ's 32x32
  // diagonal blocks stay zero (the epilogues and the inverse write the rest
  // that is read every chunk).
  for (int i = tid - kStateThreads; i < int(sizeof(s.p) + sizeof(s.t_beta)) / 16; i += kProducerThreads)
    reinterpret_cast<uint4*>(s.p)[i] = make_uint4(0u, 0u, 0u, 0u);
  wgmma::fence_shared_for_async();
  if (!item.read_v) {  // v = 0 (a piece's transition): both v stages zeroed once, never loaded
    for (int i = tid - kStateThreads; i < int(sizeof(s.v)) / 16; i += kProducerThreads)
      reinterpret_cast<uint4*>(s.v)[i] = make_uint4(0u, 0u, 0u, 0u);
    wgmma::fence_shared_for_async();
  }
  if (loader && n_chunks > 0) {
    tma::prefetch_map(&maps.q);
    tma::prefetch_map(&maps.k);
    tma::prefetch_map(&maps.v);
    load_qk_part(0, true);
    load_qk_part(0, false);
  }
  // K [K; Q]ᵀ issued a chunk ahead: at the end of chunk cc − 1's work, so that it
  // runs behind the hand-over and the wait for a free stage, and chunk cc's
  // epilogue finds it done.
  float acc[kChunk];
  auto issue_kkt = [&](int64_t cc) {
    issue_key_products(s, cc, chunk_rows(cc), a.use_qk_l2norm, pwarp, lane, acc);
  };
  // Chunk 0's gates written (warp 2) before any warp reads them: no other
  // barrier of the producer's comes between (the loads' barriers order TMA's
  // writes only).
  ProducerBarrier::sync();
  if (n_chunks > 0) issue_kkt(0);
  for (int64_t c = 0; c < n_chunks + 2; ++c) {
    const int stage = int(c & 1);
    // The state warpgroups release a stage when they finish its chunk.
    if (c >= 2) StageFree::sync(stage);
    if (c >= n_chunks) continue;
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
    if (lane == 0 && c + 1 < n_chunks) {
      if (pwarp == 0) load_qk_part(c + 1, true);
      else if (pwarp == 1) load_qk_part(c + 1, false);
    }
    if (lane == 0 && pwarp == 2 && item.read_v) load_v(c, stage);
    const int rows_in = chunk_rows(c);
    const auto vs = v_tile(stage);
    float* const gam = sm_gamma + int(c % kKStages) * kChunk;
    float* const bet = sm_beta + stage * kChunk;
    // T's tile is rewritten below: every producer warp has left chunk c − 1
    // (for c >= 2 the stage barrier above, which every producer thread joins, says so).
    if (c == 1) ProducerBarrier::sync();

    // A = β (K Kᵀ ⊙ Γ), strictly lower, fp32: K Kᵀ (issued a chunk ahead,
    // issue_kkt) and its epilogue into T's tile; Pᵀ = (Q Kᵀ ⊙ Γ)ᵀ (issued
    // with it, K Qᵀ), its epilogue into the stage's P tile.
    float* const t_fp32 = t_fp32_tile;
    {
      // The gates of this thread's rows and columns, read while the wgmmas finish.
      const int lane_group = ws::lane_id_again() >> 2, lane_in_group = ws::lane_id_again() & 3;
      float2 g_col[kChunk / 8];
#pragma unroll
      for (int j = 0; j < kChunk / 8; ++j) g_col[j] = *reinterpret_cast<const float2*>(gam + 8 * j + 2 * lane_in_group);
      const float g_row[2] = {gam[16 * pwarp + lane_group], gam[16 * pwarp + lane_group + 8]};
      const float b_row[2] = {bet[16 * pwarp + lane_group], bet[16 * pwarp + lane_group + 8]};
      wgmma::wait<0>();
      wgmma::fence_operands(acc);
      // The decayed epilogues (decay_key_products).
      const OperandTile pt = p_tile(stage);
      const OperandTile tb = tb_tile(stage);
      if (pwarp == 0) decay_key_products<0, Element>(acc, g_col, g_row, b_row, lane_group, lane_in_group, pt, tb, t_fp32);
      else if (pwarp == 1) decay_key_products<1, Element>(acc, g_col, g_row, b_row, lane_group, lane_in_group, pt, tb, t_fp32);
      else if (pwarp == 2) decay_key_products<2, Element>(acc, g_col, g_row, b_row, lane_group, lane_in_group, pt, tb, t_fp32);
      else decay_key_products<3, Element>(acc, g_col, g_row, b_row, lane_group, lane_in_group, pt, tb, t_fp32);
    }
    // No producer barrier here: each warp's 16x16 diagonal block of A (its
    // rows, their columns) was written by its own epilogue, and nothing of the
    // other warps' is read before the barrier after the substitution.
    __syncwarp();

    // T = (I + A)⁻¹'s two 32x32 diagonal blocks in two levels. First the four
    // 16x16 diagonal blocks by forward substitution (warp = block, lanes
    // 0..15 = columns; lanes 16..31 compute the same, each half stores half) in
    // fp32, column by column of A: once x_m is final it updates every later
    // row at once, so the dependent chain is 15 FMAs deep, and A's column m
    // (stored transposed by the epilogue above: row m of the block) comes in
    // as broadcast float4s.
    {
      const int b0 = 16 * pwarp, col = lane & 15;
      const float* const a_cols = t_fp32 + b0 * kLdF + b0;  // a_cols[m kLdF + r] = A[b0 + r][b0 + m]
      float x[16];
      unit_lower_inverse_column16<kLdF>(a_cols, col, x);
      __syncwarp();  // every lane has read the block
      // T's block in fp32 (the levels below read it) and Tβ's in 16 bits (β of
      // this lane's column), the latter the state's operand directly. Both
      // half-warps hold the whole column and store half of it each: lanes
      // ..15 rows 0..3 and 8..11, lanes 16.. rows 4..7 and 12..15 (four rows
      // apart, 4 · kLdF floats: the fp32 stores of one instruction fall in
      // distinct banks).
      {
        const float b_col = bet[b0 + col];
        const OperandTile tb = tb_tile(stage);
        const bool upper = lane >= 16;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r0 = 8 * h + e;  // lanes ..15 store row r0, lanes 16.. row r0 + 4
            const int r = r0 + (upper ? 4 : 0);
            const float xr = upper ? x[r0 + 4] : x[r0];
            t_fp32[(b0 + r) * kLdF + b0 + col] = xr;
            *tb.at(b0 + r, b0 + col) = Element(xr * b_col);
          }
        }
      }
    }
    // Each 32x32 diagonal block's second level needs its two 16x16 blocks and
    // A_10, all of its warp pair's: a barrier a pair.
    ProducerPair::sync(pwarp / 2);
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
      mma::mma_tf32_16x16x16_bt(m16, t_fp32 + (b0 + 16) * kLdF + b0 + 16, kLdF, t_fp32 + b0 * kLdF + b0 + 16, kLdF, lane);
      float t16[2][4] = {};  // M T_00 = −T_10
      mma::mma_tf32_16x16x16_acc_a(t16, m16, t_fp32 + b0 * kLdF + b0, kLdF, lane);
      const int lane_group = ws::lane_id_again() >> 2, lane_in_group = ws::lane_id_again() & 3;
      const OperandTile tb = tb_tile(stage);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int cc = b0 + 8 * nt + 2 * lane_in_group, r = b0 + 16 + lane_group;
        const float2 b = *reinterpret_cast<const float2*>(bet + cc);
        *reinterpret_cast<uint32_t*>(tb.at(r, cc)) = M::pack(-t16[nt][0] * b.x, -t16[nt][1] * b.y);
        *reinterpret_cast<uint32_t*>(tb.at(r + 8, cc)) = M::pack(-t16[nt][2] * b.x, -t16[nt][3] * b.y);
      }
    }
    // (No barrier: nothing of the producer's reads these blocks again in this
    // chunk, and the hand-over's barrier orders them for the state warpgroups.)
    if (item.read_v) {
      tma::wait(bar_qv + stage, uint32_t(c >> 1) & 1u);  // V(c)
      if (rows_in < kChunk) {
        prepare_rows(vs, rows_in, false);
        wgmma::fence_shared_for_async();  // V is a wgmma operand
      }
    }
    // (K(c + 1) was loaded at this chunk's start: landed by now.)
    if (c + 1 < n_chunks) issue_kkt(c + 1);

    wgmma::fence_shared_for_async();  // Tβ is a wgmma operand
    // The chunk is ready: its q, k, v, gates and Tβ.
    ws::mbarrier_arrive(s.chunk_ready + stage);
    // No barrier here: the next chunk writes T's tile (and the gate vectors'
    // stages) only after its stage barrier (its explicit one for chunk 1),
    // which every warp reaches only once it has finished this chunk.
  }
}

}  // namespace flashqla::cuda::fused_fwd
