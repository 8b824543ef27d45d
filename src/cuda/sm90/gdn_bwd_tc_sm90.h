// The tensor-core backward (K = V = 128, bf16 q, k, v and dO): three launches,
//   1. prep   (chunk, q/k head; its value heads in turn): M = (I + A)⁻¹ and the state-free products
//             W, U0, Z of each chunk            gdn_bwd_tc_prep_sm90.cu
//   2. chains (sequence, value head, V tile of 32 or 16) × 2: S entering and dS leaving
//             every chunk, in bf16; d_initial_state   gdn_bwd_tc_chains_sm90.cu
//   3. grads  (chunk, q/k head): dq, dk, dv, dg, dβ   gdn_bwd_tc_grads_sm90.cu
// all in the workspace layout below (BackwardArgs' tensor-core fields).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "cuda/backward_args.h"

namespace flashqla::cuda {

// Byte offsets of the tensor-core backward's arrays (from the workspace start).
struct TensorCoreBackwardLayout {
  int64_t chunk_slots = 0;
  size_t w = 0, u0 = 0, z = 0, minv = 0, rows = 0, states = 0, dstates = 0, progress = 0, pieces = 0, bytes = 0;
  size_t progress_bytes = 0;  // BackwardArgs::chain_progress, zeroed by each call that uses it
};

// After `offset` bytes the caller keeps; K = V = 128. piece_rows: N times the
// most pieces a sequence of the chains' sequence pieces (0: none).
inline TensorCoreBackwardLayout tensor_core_backward_layout(int64_t B, int64_t T, int64_t N, int64_t HV, bool varlen,
                                                            size_t offset, int64_t piece_rows = 0) {
  constexpr int64_t kChunk = 64, kDim = 128;
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  TensorCoreBackwardLayout l;
  l.chunk_slots = varlen ? T / kChunk + N : N * ((T + kChunk - 1) / kChunk);
  const size_t tokens = static_cast<size_t>(B * T * HV), bf16 = 2;
  l.w = align(offset);
  l.u0 = align(l.w + tokens * kDim * bf16);
  l.z = align(l.u0 + tokens * kDim * bf16);
  l.minv = align(l.z + tokens * kDim * bf16);
  l.rows = align(l.minv + tokens * kChunk * bf16);
  l.states = align(l.rows + tokens * 4 * sizeof(float));
  const size_t states = static_cast<size_t>(l.chunk_slots * HV) * kDim * kDim * bf16;
  l.dstates = align(l.states + states);
  l.progress = align(l.dstates + states);
  l.progress_bytes = static_cast<size_t>(2 * N * HV * 8 + 1) * sizeof(unsigned);  // and the grads' item ticket
  l.pieces = align(l.progress + l.progress_bytes);
  l.bytes = l.pieces + static_cast<size_t>(piece_rows * HV * kBwdPieceStates) * kDim * kDim * sizeof(float);
  return l;
}

cudaError_t launch_gdn_bwd_tc_prep(const BackwardArgs& args, cudaStream_t stream);
// value_columns: 32, or 16 (twice the CTAs; chains_value_columns in
// cuda/backward_support.h chooses).
cudaError_t launch_gdn_bwd_tc_chains(const BackwardArgs& args, int value_columns, cudaStream_t stream);

// Between the chains' two passes of sequence pieces (args.piece_chunks > 0):
// each piece's start state S and end gradient dS from its neighbours', in fp32
// (S_start(j + 1) = M_j S_start(j) + S_local(j); dS_end(j − 1) = M_jᵀ dS_end(j) +
// dS_local(j)); gdn_bwd_tc_piece_scan_sm90.cu.
cudaError_t launch_gdn_bwd_tc_piece_scan(const BackwardArgs& args, cudaStream_t stream);

// Step 3 on three warpgroups with wgmma (gdn_bwd_tc_grads_wg_sm90.cu): the one
// that runs.
// With args.chain_progress set it is launched as the chains' programmatic
// dependent, its CTAs on the SMs the chains leave idle, each chunk's gradients
// once both chains have stored its states.
cudaError_t launch_gdn_bwd_tc_grads_warpgroups(const BackwardArgs& args, cudaStream_t stream);
// Step 3 on 16 warps with mma.sync (gdn_bwd_tc_grads_sm90.cu): the kernel the
// warpgroup one replaced, selected by FLASHQLA_BACKWARD_GRADS=warps.
cudaError_t launch_gdn_bwd_tc_grads(const BackwardArgs& args, cudaStream_t stream);

}  // namespace flashqla::cuda
