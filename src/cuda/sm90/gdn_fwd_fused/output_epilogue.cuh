// The fused forward's epilogues on the state side: O of each chunk from the
// state warpgroups' accumulators to o (through a two-stage output tile, by TMA
// tensor stores or by rows), and the item's end state to its target, with a
// chained piece's hand-over to its successor.
#pragma once

#include "cuda/forward_args.h"
#include "cuda/sm90/device_common.cuh"
#include "cuda/sm90/gdn_fwd_fused/kernel_layout.cuh"
#include "cuda/sm90/tma_load.cuh"
#include "cuda/sm90/warp_mma.cuh"
#include "cuda/sm90/warpgroup_mma.cuh"

namespace flashqla::cuda::fused_fwd {

template <typename Element>
struct OutputEpilogue {
  using M = mma::Mma<Element>;
  using Storage = SharedStorage<Element>;

  Storage& s;
  const ForwardArgs& a;
  const TokenMaps& maps;
  const int warp, wr, v0;  // warp index, warp in the warpgroup, the warpgroup's first value

  __device__ __forceinline__ OutputMode mode() const { return OutputMode(s.parked.output_mode); }
  // The warpgroup's output tile of a stage for tensor stores.
  __device__ __forceinline__ auto tensor_tile(int stage) const { return s.output_tensor_tile(stage, warp >> 2); }
  // One thread a warpgroup issues its tensor stores (the lane read again: no
  // register held across the chunk loop).
  __device__ __forceinline__ bool issuer() const { return wr == 0 && ws::lane_id_again() == 0; }

  // Rows < rows of chunk cc's output tile to o (a warp a row's 64 values of the
  // warpgroup's, coalesced), from the padded tile (by rows) or the tensor
  // stores' tile (its partial last chunk).
  __device__ __forceinline__ void store_rows(int cc, int rows, bool tensor_tile_layout) const {
    const int ln = ws::lane_id_again();
    Element* const o_chunk = s.parked.o_rows + int64_t(cc) * kChunk * a.o_st + v0 + 2 * ln;
    if (tensor_tile_layout) {
      const auto tile = tensor_tile(cc & 1);
      for (int i = wr; i < rows; i += 4)
        *reinterpret_cast<uint32_t*>(o_chunk + i * a.o_st) = *reinterpret_cast<const uint32_t*>(tile.at(i, 2 * ln));
      return;
    }
    const Element* const ot = s.output_rows(cc & 1) + v0 + 2 * ln;
#pragma unroll 4
    for (int i = wr; i < rows; i += 4)
      *reinterpret_cast<uint32_t*>(o_chunk + i * a.o_st) = *reinterpret_cast<const uint32_t*>(ot + i * kLdO);
  }

  // Before chunk c's hand-over: chunk c − 2's tensor store has read this
  // stage's output tile before any thread passes the barrier that follows (and
  // writes the tile again).
  __device__ __forceinline__ void before_chunk() const {
    if (issuer() && mode() == kOutputTensor) tma::wait_stores_read<1>();
  }

  // Chunk c's rows in the sequence, by rows, while chunk c + 1's last wgmmas run
  // (chunk c was whole).
  __device__ __forceinline__ void store_previous_rows(int c) const {
    if (c > 0 && mode() == kOutputRows) store_rows(c - 1, kChunk, false);
  }

  // O = scale Oᵀᵀ of chunk c: o_acc[4 j + e] (value v0 + 16 wr + lane_group +
  // 8 (e / 2), token 8 j + 2 t + e % 2) into the stage's output tile; its rows
  // in the sequence go out by a tensor store now, or by store_previous_rows
  // while the next chunk's last wgmmas run (after the barrier below: every
  // warp's part of the tile written). The tile has two stages: chunk c + 2
  // writes this one after every thread of the warpgroup passed chunk c + 1's
  // barrier, i.e. finished reading it.
  __device__ __forceinline__ void write_chunk(const float (&o_acc)[kChunk / 2], int stage, int c, int nc) const {
    const int output_mode = mode();
    if (output_mode == kOutputNone) return;
    // stmatrix, transposed: the 8x8 blocks (tokens 8 j.., values 16 wr + 8 h..)
    // of n8 tiles j and j + 1, h = 0, 1; lane 8 m + r gives the address of token
    // row r of block m (j + m / 2, h = m % 2): in the padded tile, or in the
    // tensor stores' swizzled tile (a row's 16 bytes in one chunk).
    const int ln = ws::lane_id_again(), m = ln >> 3;
    const bool tensor = output_mode == kOutputTensor;
    Element* const row = tensor ? tensor_tile(stage).at(8 * (m >> 1) + (ln & 7), 16 * wr + 8 * (m & 1))
                                : s.output_rows(stage) + (8 * (m >> 1) + (ln & 7)) * kLdO + v0 + 16 * wr + 8 * (m & 1);
    const int j_step = tensor ? 8 * (kDim / 2) : 8 * kLdO;  // elements from n8 tile j to j + 1's rows
#pragma unroll
    for (int j = 0; j < kChunk / 8; j += 2) {
      const float* o = o_acc + 4 * j;
      mma::stsm_x4_trans(row + j * j_step, M::pack(a.scale * o[0], a.scale * o[1]),
                         M::pack(a.scale * o[2], a.scale * o[3]), M::pack(a.scale * o[4], a.scale * o[5]),
                         M::pack(a.scale * o[6], a.scale * o[7]));
    }
    if (tensor) wgmma::fence_shared_for_async();  // the tile's writes before the TMA unit reads it
    OutputWritten::sync(warp >> 2);
    if (tensor && issuer() && (c + 1 < nc || s.parked.last_rows == kChunk))
      tma::store_output_tile(&maps.o, tensor_tile(stage).base, v0, s.parked.o_token + c * kChunk, s.parked.o_head,
                             s.parked.o_row);
  }

  // After the chunk loop: the last chunk's rows where they go by rows (or are a
  // partial chunk), and every tensor store complete.
  __device__ __forceinline__ void finish(int nc) const {
    if (const int output_mode = mode(); nc > 0 && output_mode != kOutputNone) {
      const int last_rows = s.parked.last_rows;
      if (output_mode == kOutputRows || last_rows < kChunk) store_rows(nc - 1, last_rows, output_mode == kOutputTensor);
      if (issuer() && output_mode == kOutputTensor) tma::wait_stores_done();
    }
  }
};

// Sᵀ (the wgmma accumulator layout of m64n128: s_acc[4 j + e] is value v0 +
// 16 wr + lane_group + 8 (e / 2), key 8 j + 2 lane_in_group + e % 2) to the
// item's final-state target, then a chained piece's signal to its successor.
template <typename Element>
__device__ __forceinline__ void store_end_state(SharedStorage<Element>& s, const float (&s_acc)[64], int v0, int wr,
                                                int lane_group, int lane_in_group) {
  const StateTarget final_state = s.parked.final_state;
  if (final_state.ptr != nullptr) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int v = v0 + 16 * wr + lane_group + ((i >> 1) & 1) * 8, k = 8 * (i >> 2) + 2 * lane_in_group + (i & 1);
      final_state.store(k, v, s_acc[i]);
    }
  }
  unsigned* const signal = s.parked.signal;
  if (signal != nullptr) {
    __threadfence();
    StateBarrier::sync();  // every state thread's stores fenced
    if (threadIdx.x == 0) add_release(signal, 1u);
  }
}

}  // namespace flashqla::cuda::fused_fwd
