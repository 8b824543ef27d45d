#include "cuda/sm90/gdn_fwd_piece_scan_sm90.h"

#include "core/trace.h"
#include "cuda/sm90/forward_work_item.cuh"

namespace flashqla::cuda {
namespace {

constexpr int kColumns = 8;  // state columns per CTA
constexpr int kMaxKeys = 128;

// CTA: (sequence, value head) x a block of kColumns state columns; thread: one
// key row. end(0) is piece 0's partial state; for j >= 1, start(j) = end(j − 1)
// and end(j) = M_j start(j) + local(j), in fp32.
__global__ void __launch_bounds__(kMaxKeys) gdn_fwd_piece_scan_kernel(const ForwardArgs a) {
  __shared__ float s[kMaxKeys][kColumns + 1];
  const int64_t n = int64_t(blockIdx.x) / a.HV, hv = int64_t(blockIdx.x) % a.HV;
  const int64_t c0 = int64_t(blockIdx.y) * kColumns;
  const int r = threadIdx.x;
  int64_t first = 0;
  for (int64_t m = 0; m < n; ++m) first += piece_count(a, sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, m));
  const int64_t pieces = piece_count(a, sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, n));
  if (pieces < 2) return;
  const float* local0 = a.piece_states + piece_state_base(a, first, hv, kPieceLocal);
#pragma unroll
  for (int c = 0; c < kColumns; ++c) s[r][c] = local0[r * a.V + c0 + c];
  __syncthreads();
  for (int64_t j = 1; j < pieces; ++j) {
    float* start = a.piece_states + piece_state_base(a, first + j, hv, kPieceStart);
#pragma unroll
    for (int c = 0; c < kColumns; ++c) start[r * a.V + c0 + c] = s[r][c];
    if (j == pieces - 1) break;
    // M_j is stored transposed: M_j[r][k] at k * K + r (coalesced over r).
    const float* mt = a.piece_states + piece_state_base(a, first + j, hv, kPieceTransition);
    const float* local = a.piece_states + piece_state_base(a, first + j, hv, kPieceLocal);
    float acc[kColumns];
#pragma unroll
    for (int c = 0; c < kColumns; ++c) acc[c] = local[r * a.V + c0 + c];
    for (int k = 0; k < a.K; ++k) {
      const float m = mt[k * a.K + r];
#pragma unroll
      for (int c = 0; c < kColumns; ++c) acc[c] += m * s[k][c];
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kColumns; ++c) s[r][c] = acc[c];
    __syncthreads();
  }
}

}  // namespace

cudaError_t launch_gdn_fwd_piece_scan(const ForwardArgs& args, cudaStream_t stream) {
  if (args.N * args.HV == 0) return cudaSuccess;
  if (args.K != kMaxKeys || args.V % kColumns != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(args.N * args.HV), static_cast<unsigned>(args.V / kColumns));
  FLASHQLA_PLAN("gdn_fwd_piece_scan_kernel: grid=%ux%u block=%d", grid.x, grid.y, kMaxKeys);
  gdn_fwd_piece_scan_kernel<<<grid, kMaxKeys, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
