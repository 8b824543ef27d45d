// The fused forward's chunk producer (warpgroup 2): for each chunk, one ahead
// of the state chain, the TMA loads of q, k and v, the gate vectors, K Kᵀ and
// K Qᵀ on wgmma, their decayed epilogues (A, Pᵀ and L_10), the two 32x32
// diagonal blocks of T = (I + A)⁻¹ times β, and the hand-over to the state
// warpgroups. Steps named after the algebra of docs/design.md.
#pragma once

#include <type_traits>

#include "cuda/forward_args.h"
#include "cuda/sm90/device_common.cuh"
#include "cuda/sm90/gdn_fwd_fused/kernel_layout.cuh"
#include "cuda/sm90/tma_load.cuh"
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

template <typename Element>
struct ChunkProducer {
  using M = mma::Mma<Element>;
  using Storage = SharedStorage<Element>;
  using OperandTile = typename Storage::OperandTile;

  Storage& s;
  const ForwardArgs& a;
  const TokenMaps& maps;
  const bool read_v;       // the item reads v (else v = 0: a piece's transition)
  const int pwarp, lane;   // warp in the warpgroup, lane
  const int head_qk, head_v, batch_row;
  const int bos, eos;      // the item's first token, its sequence's end
  const int64_t n_chunks;
  // Chunk c + 1's gates as raw bits (warp 2), loaded one chunk ahead.
  uint32_t g_next[2] = {}, b_next[2] = {};
  // K [K; Q]ᵀ of the next chunk, issued a chunk ahead (issue_key_products): the
  // kernel's own array (an array member of the part itself is kept out of
  // registers in part).
  float (&acc)[kChunk];

  __device__ __forceinline__ ChunkProducer(Storage& storage, const ForwardArgs& args, const TokenMaps& token_maps,
                                           const WorkItem& item, float (&key_products)[kChunk], int warp_in_group,
                                           int lane_id, int first_token, int end_token, int64_t chunks)
      : s(storage),
        a(args),
        maps(token_maps),
        read_v(item.read_v),
        pwarp(warp_in_group),
        lane(lane_id),
        head_qk(int(item.hv / args.group)),
        head_v(int(item.hv)),
        batch_row(int(item.seq.row)),
        bos(first_token),
        eos(end_token),
        n_chunks(chunks),
        acc(key_products) {}

  // Rows of chunk c in the item (kChunk but for a partial last chunk).
  __device__ __forceinline__ int chunk_rows(int64_t c) const {
    return int(min64(kChunk, int64_t(eos - bos) - c * kChunk));
  }

  // Chunk c's k (its two 64-feature boxes, with the barrier's byte count for
  // both tensors) or q (its two boxes) into the stage's [K; Q] tile: each
  // 64-feature column block holds k's rows, then q's.
  __device__ __forceinline__ void load_qk_part(int64_t c, bool k_part) {
    uint64_t* const bar = s.qk_loaded + QKPipeline::of(c).index;
    if (k_part) tma::arrive_expect_bytes(bar, 2 * kChunk * kDim * int(sizeof(Element)));
    const auto t = k_part ? s.k_tile(c) : s.q_tile(c);
#pragma unroll
    for (int b = 0; b < 2; ++b)
      tma::load_token_tile(t.at(0, 64 * b), k_part ? &maps.k : &maps.q, bar, int(bos + c * kChunk), head_qk,
                           batch_row, b);
  }
  __device__ __forceinline__ void load_v(int64_t c, int stage) {  // only where read_v
    uint64_t* const bar = s.v_loaded + stage;
    tma::arrive_expect_bytes(bar, kChunk * kDim * int(sizeof(Element)));
    tma::load_token_tile(s.v_tile(stage).base, &maps.v, bar, int(bos + c * kChunk), head_v, batch_row);
  }

  // Rows of a landed tile (warp: row blocks w and w + 4; lane: row lane % 8,
  // 16-byte segments lane / 8 + 4 s of it, conflict-free): rows >= rows_in zeroed
  // (past a packed sequence's end they hold the next sequence's tokens), the
  // others scaled to x · rsqrt(Σx² + 1e-6) where normalize.
  template <typename Tile>
  __device__ __forceinline__ void prepare_rows(Tile tile, int rows_in, bool normalize) {
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

  // Gates of a chunk as raw bits (warp 2, rows 2 lane and 2 lane + 1; rows
  // past the end read a valid row and are zeroed where converted), loaded one
  // chunk ahead so their latency hides behind A and T: converted only where
  // used (a conversion next to the load would stall the warp for the global
  // load's latency).
  __device__ __forceinline__ void load_gates(int64_t c) {
    const int64_t tc = int64_t(bos) + c * kChunk;
    const int rows_in = chunk_rows(c);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int r = 2 * lane + j;
      const int64_t t = tc + (r < rows_in ? r : 0);
      g_next[j] = load_raw(a.g, a.g_dtype, batch_row * a.g_sb + t * a.g_st + head_v);
      b_next[j] = load_raw(a.beta, a.beta_dtype, batch_row * a.beta_sb + t * a.beta_st + head_v);
    }
  }

  // The gate vectors of chunk cc (one warp: γ = inclusive in-chunk cumsum of
  // g, e^γ, e^{γ_C − γ}, β; rows past the end: g = 0, β = 0) from the raw bits
  // loaded before; then chunk cc + 1's gate loads. Warp 2 runs it for chunk
  // c + 1 while warps 0 and 3 finish chunk c's inverse.
  __device__ __forceinline__ void compute_gates(int64_t cc) {
    const int rows_in = chunk_rows(cc);
    float gr[2], br[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const bool in = 2 * lane + j < rows_in;
      gr[j] = in ? raw_to_float(g_next[j], a.g_dtype) : 0.f;
      br[j] = in ? activate_beta(raw_to_float(b_next[j], a.beta_dtype), a.beta_activation) : 0.f;
    }
    if (cc + 1 < n_chunks) load_gates(cc + 1);
    const float pair = gr[0] + gr[1];
    float incl = pair;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const float y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    const float g0 = incl - pair + gr[0], g1 = incl;
    const float g_last = __shfl_sync(0xffffffffu, incl, 31);  // rows past the end add g = 0
    const int qs = QKPipeline::of(cc).index, hs = int(cc & 1);
    float* const gamma = s.gates.gamma[qs];
    float* const exp_gamma = s.gates.exp_gamma[qs];
    float* const decay = s.gates.decay[qs];
    gamma[2 * lane] = g0 * kLog2e;
    gamma[2 * lane + 1] = g1 * kLog2e;
    exp_gamma[2 * lane] = __expf(g0);
    exp_gamma[2 * lane + 1] = __expf(g1);
    decay[2 * lane] = __expf(g_last - g0);
    decay[2 * lane + 1] = __expf(g_last - g1);
    s.gates.beta[hs][2 * lane] = br[0];
    s.gates.beta[hs][2 * lane + 1] = br[1];
  }

  // K [K; Q]ᵀ of chunk cc (wgmma m64n128, A = K, B = the stage's [K; Q], both
  // K-major) into acc: n8 tiles ..7 K Kᵀ, 8.. K Qᵀ = Pᵀ before its decay.
  // Issued a chunk ahead: at the end of chunk cc − 1's work, so that it runs
  // behind the hand-over and the wait for a free stage, and chunk cc's
  // epilogue finds it done. Rows past the end are zeroed (and l2-normalized) first.
  __device__ __forceinline__ void issue_key_products(int64_t cc) {
    const int rows_in = chunk_rows(cc);
    const QKPipeline qk = QKPipeline::of(cc);
    tma::wait(s.qk_loaded + qk.index, qk.phase);  // Q(cc), K(cc)
    if (rows_in < kChunk || a.use_qk_l2norm) {
      prepare_rows(s.k_tile(cc), rows_in, a.use_qk_l2norm);
      prepare_rows(s.q_tile(cc), rows_in, a.use_qk_l2norm);
      wgmma::fence_shared_for_async();  // Q and K are wgmma operands
      ProducerBarrier::sync();
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) acc[i] = 0.f;
    wgmma::fence(acc);
    const auto kt = s.k_tile(cc);  // A: its rows ..63 (K); B: all 128 ([K; Q])
#pragma unroll
    for (int k = 0; k < kDim / 16; ++k)
      wgmma::mma_ss<Element, 2 * kChunk, wgmma::kK, wgmma::kK>(wgmma::kmajor_desc(kt, 16 * k),
                                                               wgmma::kmajor_desc(kt, 16 * k), acc);
    wgmma::commit();
  }

  // The decayed epilogues of K Kᵀ and K Qᵀ, one pass over warp kWarp's 16
  // token rows i (the warp index a compile-time constant: each warp's code
  // knows which of its column tiles hold what). One exponential a position
  // (i, j), shared by the entries there: e^{γ_i − γ_j} below the diagonal (A's
  // and L_10's), e^{γ_j − γ_i} on and above it (Pᵀ's, and the L_10 quarters
  // warps 0 and 1 take from above the diagonal, below); 32 a thread on every warp:
  // - Pᵀ = (Q Kᵀ ⊙ Γ)ᵀ, 0 below the diagonal ((K Qᵀ)[i][j] = (Q Kᵀ)[j][i],
  //   taken for j >= i), into the stage's P tile as it is (the state chain
  //   reads it as an MN-major operand); column tiles wholly left of the warp's
  //   rows (8 j + 7 < 16 w) are zeros, written once for the item, not a chunk;
  // - A = β (K Kᵀ ⊙ Γ), 0 on and above the diagonal: the warp's 16 rows of its
  //   32x32 diagonal block, transposed into T's tile (inverted there in place;
  //   the substitution reads them so, conflict-free);
  // - a quarter of the block below the diagonal blocks, L_10 = (K Kᵀ ⊙ Γ)'s
  //   rows 32.., columns ..31 (A_10 without β), in 16 bits into Tβ's tile
  //   there, the state chain's operand (T's block below the diagonal is never
  //   formed: the state chain's step 2). K Kᵀ is symmetric, so warps 0 and 1
  //   take their quarters from their own rows' columns 32..63 (warp 0:
  //   L_10[16..31][0..15], warp 1: L_10[0..15][16..31]; the factor there
  //   e^{γ_j − γ_i}, Pᵀ's); warps 2 and 3 theirs directly (warp 2:
  //   L_10[0..15][0..15], warp 3: L_10[16..31][16..31]).
  // The rest of the accumulators is never read.
  template <int kWarp>
  __device__ __forceinline__ void decay_key_products(const float2 (&gate_col)[kChunk / 8], const float (&gate_row)[2],
                                                     const float (&beta_row)[2], int lane_group, int lane_in_group,
                                                     int stage) {
    constexpr int kDiag = 4 * (kWarp / 2);                                 // the diagonal block's first column tile
    constexpr int kQuarter = kWarp < 2 ? 6 - 2 * kWarp : 2 * (kWarp - 2);  // the quarter's
    constexpr bool kSymmetric = kWarp < 2;
    constexpr int kBelow = 2 * kWarp + 2;  // column tiles >= this are above every row of the warp
    constexpr int kFirstP = 2 * kWarp;     // column tiles < this are left of every row of the warp
    const float* const acc_p = acc + kChunk / 2;  // Pᵀ's n8 tiles
    const OperandTile pt = s.p_tile(stage), tb = s.t_beta_tile(stage);
    float* const t = s.inverse.t;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * kWarp + lane_group + 8 * half;
#pragma unroll
      for (int j = 0; j < kChunk / 8; ++j) {
        const int col = 8 * j + 2 * lane_in_group;
        const float e0 =
            masked_exp2(true, col < i ? gate_row[half] - gate_col[j].x : gate_col[j].x - gate_row[half]);
        const float e1 =
            masked_exp2(true, col + 1 < i ? gate_row[half] - gate_col[j].y : gate_col[j].y - gate_row[half]);
        if (j >= kFirstP)
          *reinterpret_cast<uint32_t*>(pt.at(i, col)) = M::pack(col >= i ? acc_p[4 * j + 2 * half] * e0 : 0.f,
                                                                col + 1 >= i ? acc_p[4 * j + 2 * half + 1] * e1 : 0.f);
        if (kSymmetric && j >= kQuarter && j < kQuarter + 2) {
          // (K Kᵀ)[i][col] is L's entry at row col (>= 32 > i), column i.
          *tb.at(col, i) = Element(acc[4 * j + 2 * half] * e0);
          *tb.at(col + 1, i) = Element(acc[4 * j + 2 * half + 1] * e1);
        }
        // A's entries above the warp's rows are never read (in the diagonal
        // block's lower-left quadrant, transposed, unused).
        if (j >= kBelow) continue;
        if (j >= kDiag && j < kDiag + 4) {
          t[col * kLdF + i] = col < i ? acc[4 * j + 2 * half] * beta_row[half] * e0 : 0.f;
          t[(col + 1) * kLdF + i] = col + 1 < i ? acc[4 * j + 2 * half + 1] * beta_row[half] * e1 : 0.f;
        }
        if (!kSymmetric && j >= kQuarter && j < kQuarter + 2)
          *reinterpret_cast<uint32_t*>(tb.at(i, col)) =
              M::pack(acc[4 * j + 2 * half] * e0, acc[4 * j + 2 * half + 1] * e1);
      }
    }
  }

  // A, Pᵀ and L_10 of chunk c: waits for K [K; Q]ᵀ (issued a chunk ahead) and
  // runs the warp's epilogue.
  __device__ __forceinline__ void form_a_and_p(const float* gamma, const float* beta, int stage) {
    // The gates of this thread's rows and columns, read while the wgmmas finish.
    const int lane_group = ws::lane_id_again() >> 2, lane_in_group = ws::lane_id_again() & 3;
    float2 gate_col[kChunk / 8];
#pragma unroll
    for (int j = 0; j < kChunk / 8; ++j)
      gate_col[j] = *reinterpret_cast<const float2*>(gamma + 8 * j + 2 * lane_in_group);
    const float gate_row[2] = {gamma[16 * pwarp + lane_group], gamma[16 * pwarp + lane_group + 8]};
    const float beta_row[2] = {beta[16 * pwarp + lane_group], beta[16 * pwarp + lane_group + 8]};
    wgmma::wait<0>();
    wgmma::fence_operands(acc);
    if (pwarp == 0) decay_key_products<0>(gate_col, gate_row, beta_row, lane_group, lane_in_group, stage);
    else if (pwarp == 1) decay_key_products<1>(gate_col, gate_row, beta_row, lane_group, lane_in_group, stage);
    else if (pwarp == 2) decay_key_products<2>(gate_col, gate_row, beta_row, lane_group, lane_in_group, stage);
    else decay_key_products<3>(gate_col, gate_row, beta_row, lane_group, lane_in_group, stage);
  }

  // T = (I + A)⁻¹'s four 16x16 diagonal blocks by forward substitution (warp =
  // block, lanes 0..15 = columns; lanes 16..31 compute the same, each half
  // stores half) in fp32, column by column of A: once x_m is final it updates
  // every later row at once, so the dependent chain is 15 FMAs deep, and A's
  // column m (stored transposed by the epilogue: row m of the block) comes in as
  // broadcast float4s. Stores T's block in fp32 (the second level reads it) and
  // Tβ's in 16 bits (β of this lane's column), the state chain's operand.
  __device__ __forceinline__ void invert_diagonal_blocks(const float* beta, int stage) {
    float* const t = s.inverse.t;
    const int b0 = 16 * pwarp, col = lane & 15;
    const float* const a_cols = t + b0 * kLdF + b0;  // a_cols[m kLdF + r] = A[b0 + r][b0 + m]
    // The identity column, built here each chunk: as loop-invariant values ptxas
    // would keep them live across the chunk loop; the volatile move pins them inside.
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
    // Both half-warps hold the whole column and store half of it each: lanes
    // ..15 rows 0..3 and 8..11, lanes 16.. rows 4..7 and 12..15 (four rows
    // apart, 4 · kLdF floats: the fp32 stores of one instruction fall in
    // distinct banks).
    const float b_col = beta[b0 + col];
    const OperandTile tb = s.t_beta_tile(stage);
    const bool upper = lane >= 16;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r0 = 8 * h + e;  // lanes ..15 store row r0, lanes 16.. row r0 + 4
        const int r = r0 + (upper ? 4 : 0);
        const float xr = upper ? x[r0 + 4] : x[r0];
        t[(b0 + r) * kLdF + b0 + col] = xr;
        *tb.at(b0 + r, b0 + col) = Element(xr * b_col);
      }
    }
  }

  // Inside a 32x32 diagonal block (warp 0 the block at 0, warp 3 the block at
  // 32, each after its pair's barrier), its block below the diagonal, T_10 =
  // −T_11 A_10 T_00 (16x16, tf32): A_10 read where the epilogue left it
  // (transposed, in the block's unused upper-right quadrant), M = T_11 A_10 in
  // registers, the accumulator taken as the next product's A operand, and T_10
  // only in 16 bits, as Tβ's block (the fp32 tile never holds it).
  __device__ __forceinline__ void complete_diagonal_block(const float* beta, int stage) {
    const float* const t = s.inverse.t;
    const int b0 = 32 * (pwarp / 2);
    float m16[2][4] = {};
    mma::mma_tf32_16x16x16_bt(m16, t + (b0 + 16) * kLdF + b0 + 16, kLdF, t + b0 * kLdF + b0 + 16, kLdF, lane);
    float t16[2][4] = {};  // M T_00 = −T_10
    mma::mma_tf32_16x16x16_acc_a(t16, m16, t + b0 * kLdF + b0, kLdF, lane);
    const int lane_group = ws::lane_id_again() >> 2, lane_in_group = ws::lane_id_again() & 3;
    const OperandTile tb = s.t_beta_tile(stage);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int cc = b0 + 8 * nt + 2 * lane_in_group, r = b0 + 16 + lane_group;
      const float2 b = *reinterpret_cast<const float2*>(beta + cc);
      *reinterpret_cast<uint32_t*>(tb.at(r, cc)) = M::pack(-t16[nt][0] * b.x, -t16[nt][1] * b.y);
      *reinterpret_cast<uint32_t*>(tb.at(r + 8, cc)) = M::pack(-t16[nt][2] * b.x, -t16[nt][3] * b.y);
    }
  }

  // Before the chunk loop: chunk 0's gates and loads, the operand tiles' fixed
  // zeros.
  __device__ __forceinline__ void prologue() {
    const int ptid = int(threadIdx.x) - kStateThreads;
    if (pwarp == 2 && n_chunks > 0) {  // chunk 0's before the loop (the barrier below orders them)
      load_gates(0);
      compute_gates(0);
    }
    // P's and Tβ's two stages (adjacent) zeroed once: Pᵀ's column tiles left of
    // each warp's rows and the upper-right 16x16 quadrants of Tβ's 32x32
    // diagonal blocks stay zero (the epilogues and the inverse write the rest
    // that is read every chunk).
    uint4* const operands = reinterpret_cast<uint4*>(s.p);
    for (int i = ptid; i < int(sizeof(s.p) + sizeof(s.t_beta)) / 16; i += kProducerThreads)
      operands[i] = make_uint4(0u, 0u, 0u, 0u);
    wgmma::fence_shared_for_async();
    if (!read_v) {  // v = 0 (a piece's transition): both v stages zeroed once, never loaded
      uint4* const v = reinterpret_cast<uint4*>(s.v);
      for (int i = ptid; i < int(sizeof(s.v)) / 16; i += kProducerThreads) v[i] = make_uint4(0u, 0u, 0u, 0u);
      wgmma::fence_shared_for_async();
    }
    if (ptid == 0 && n_chunks > 0) {  // the loader thread
      tma::prefetch_map(&maps.q);
      tma::prefetch_map(&maps.k);
      tma::prefetch_map(&maps.v);
      load_qk_part(0, true);
      load_qk_part(0, false);
    }
    // Chunk 0's gates written (warp 2) before any warp reads them: no other
    // barrier of the producer's comes between (the loads' barriers order TMA's
    // writes only).
    ProducerBarrier::sync();
    if (n_chunks > 0) issue_key_products(0);
  }

  // The chunk loop. Chunk c's q and k stage is c % 3 (its (c / 3)-th use), its
  // v, P, Tβ and β stage c % 2 (its (c / 2)-th use).
  __device__ __forceinline__ void run() {
    prologue();
    for (int64_t c = 0; c < n_chunks + 2; ++c) {
      const int stage = int(c & 1);
      // The state warpgroups release a stage when they finish its chunk.
      if (c >= 2) StageFree::sync(stage);
      if (c >= n_chunks) continue;
      // V(c) into the stage chunk c − 2 released, Q(c + 1) and K(c + 1) into
      // chunk c − 2's q/k stage (released by the same barrier). No proxy fence
      // before the loads: the stage's generic writes (rows of a partial chunk,
      // zeroed v) were fenced by their writers when made, and its generic reads
      // ended before the stage barrier above (a read before an async-proxy
      // write needs no fence, as in CUTLASS's TMA pipelines). The loads spread
      // over three warps' first lanes (k, q, v), so that no one warp's epilogue
      // starts behind all five TMA issues; the q/k barrier's byte count is set
      // by k's issuer before its own copies (a copy of q's completing first
      // only takes the count below zero while k's arrival is still pending, so
      // the phase cannot complete early).
      if (lane == 0 && c + 1 < n_chunks) {
        if (pwarp == 0) load_qk_part(c + 1, true);
        else if (pwarp == 1) load_qk_part(c + 1, false);
      }
      if (lane == 0 && pwarp == 2 && read_v) load_v(c, stage);
      const float* const gamma = s.gates.gamma[QKPipeline::of(c).index];
      const float* const beta = s.gates.beta[stage];
      // T's tile is rewritten below: every producer warp has left chunk c − 1
      // (for c >= 2 the stage barrier above, which every producer thread joins, says so).
      if (c == 1) ProducerBarrier::sync();

      form_a_and_p(gamma, beta, stage);
      // No producer barrier here: each warp's 16x16 diagonal block of A (its
      // rows, their columns) was written by its own epilogue, and nothing of
      // the other warps' is read before the barrier after the substitution.
      __syncwarp();
      invert_diagonal_blocks(beta, stage);
      // Each 32x32 diagonal block's second level needs its two 16x16 blocks and
      // A_10, all of its warp pair's.
      ProducerPair::sync(pwarp / 2);
      // Warp 2 meanwhile forms the next chunk's gates (into the stages chunk
      // c + 1 reads, after the producer's stage barrier).
      if (pwarp == 2 && c + 1 < n_chunks) compute_gates(c + 1);
      if (pwarp == 0 || pwarp == 3) complete_diagonal_block(beta, stage);
      // (No barrier: nothing of the producer's reads these blocks again in this
      // chunk, and the hand-over's barrier orders them for the state warpgroups.)
      if (read_v) {
        const HandOverPipeline vp = HandOverPipeline::of(c);
        tma::wait(s.v_loaded + vp.index, vp.phase);  // V(c)
        if (const int rows_in = chunk_rows(c); rows_in < kChunk) {
          prepare_rows(s.v_tile(stage), rows_in, false);
          wgmma::fence_shared_for_async();  // V is a wgmma operand
        }
      }
      // (K(c + 1) was loaded at this chunk's start: landed by now.)
      if (c + 1 < n_chunks) issue_key_products(c + 1);
      wgmma::fence_shared_for_async();  // Tβ is a wgmma operand
      // The chunk is ready: its q, k, v, gates and Tβ. No barrier after: the
      // next chunk writes T's tile (and the gate vectors' stages) only after its
      // stage barrier (its explicit one for chunk 1), which every warp reaches
      // only once it has finished this chunk.
      ChunkReady::arrive(stage);
    }
  }
};

}  // namespace flashqla::cuda::fused_fwd
