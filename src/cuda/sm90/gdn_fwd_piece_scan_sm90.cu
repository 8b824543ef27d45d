#include "cuda/sm90/gdn_fwd_piece_scan_sm90.h"

#include "core/trace.h"
#include "cuda/sm90/piece_scan_step.cuh"
#include "cuda/sm90/work_scheduler.cuh"

namespace flashqla::cuda {
namespace {

constexpr int kColumns = 8;  // state columns per CTA
constexpr int kMaxKeys = 128;

// CTA: (sequence, value head) x a block of kColumns state columns; thread: one
// key row. end(0) is piece 0's partial state; for j >= 1, start(j) = end(j − 1)
// and end(j) = M_j start(j) + local(j), in fp32. A step is one dependent load
// latency: a thread loads its whole row of M_j (128 registers) and its local
// values before any product.
__global__ void __launch_bounds__(kMaxKeys) gdn_fwd_piece_scan_kernel(const ForwardArgs a) {
  __shared__ __align__(16) float s[kMaxKeys][kColumns];
  // The output pass (launched as a programmatic dependent of this grid) may start
  // loading its first chunks now; it waits for this grid before it reads a start state.
  allow_dependent_grids();
  const int64_t n = int64_t(blockIdx.x) / a.HV, hv = int64_t(blockIdx.x) % a.HV;
  const int64_t c0 = int64_t(blockIdx.y) * kColumns;
  const int r = threadIdx.x;
  int64_t first = 0;
  for (int64_t m = 0; m < n; ++m) first += piece_count(a, sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, m));
  const int64_t pieces = piece_count(a, sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, n));
  if (pieces < 2) return;
  auto row = [&](const float* base) {  // this thread's kColumns values of a [K][V] state
    return reinterpret_cast<const float4*>(base + r * a.V + c0);
  };
  const float4* const local0 = row(a.piece_states + piece_state_base(a, first, hv, kPieceLocal));
  float4 lo = local0[0], hi = local0[1];
  for (int64_t j = 1; j < pieces; ++j) {
    float4* start = reinterpret_cast<float4*>(a.piece_states + piece_state_base(a, first + j, hv, kPieceStart) +
                                              r * a.V + c0);
    start[0] = lo, start[1] = hi;
    if (j == pieces - 1) break;
    __syncthreads();  // the previous step's reads of s are done
    reinterpret_cast<float4*>(s[r])[0] = lo;
    reinterpret_cast<float4*>(s[r])[1] = hi;
    // M_j is stored transposed: M_j[r][k] at k * K + r (coalesced over r).
    const float* mt = a.piece_states + piece_state_base(a, first + j, hv, kPieceTransition);
    float m[kMaxKeys];
#pragma unroll
    for (int k = 0; k < kMaxKeys; ++k) m[k] = mt[k * kMaxKeys + r];
    const float4* local = row(a.piece_states + piece_state_base(a, first + j, hv, kPieceLocal));
    float4 acc_lo = local[0], acc_hi = local[1];
    __syncthreads();  // s written
    piece_scan_row_step(m, s, acc_lo, acc_hi);
    lo = acc_lo, hi = acc_hi;
  }
}

}  // namespace

cudaError_t launch_gdn_fwd_piece_scan(const ForwardArgs& args, cudaStream_t stream) {
  if (args.N * args.HV == 0) return cudaSuccess;
  // One thread a key row, float4 rows of kColumns values (V a multiple of kColumns: 16-byte aligned).
  if (args.K != kMaxKeys || args.V % kColumns != 0) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(args.N * args.HV), static_cast<unsigned>(args.V / kColumns));
  FLASHQLA_PLAN("gdn_fwd_piece_scan_kernel: grid=%ux%u block=%d", grid.x, grid.y, kMaxKeys);
  gdn_fwd_piece_scan_kernel<<<grid, kMaxKeys, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
