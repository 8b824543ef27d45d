// The tensor-core backward's sequence pieces, between the chains' two passes:
// each piece's start state and end gradient from its neighbours', in fp32.
//   state     S_start(j + 1) = M_j S_start(j) + S_local(j),     j = 1 .. P − 2
//             (S_start(1): the first piece's end, from the first pass)
//   gradient  dS_end(j − 1) = M_jᵀ dS_end(j) + dS_local(j),     j = P − 2 .. 1
//             (dS_end(P − 2): the last piece's result, from the first pass)
// M_j is the state chain's transition over piece j (its end state from the
// identity with U0 = 0), so the gradient chain's is its transpose
// (A_c = e^{γ_L} I − K̂ᵀ diag(b) W per chunk; the gradient step is A_cᵀ).
#include "cuda/sm90/gdn_bwd_tc_sm90.h"

#include "cuda/sm90/gdn_bwd_tc/common.cuh"
#include "cuda/sm90/piece_scan_step.cuh"

namespace flashqla::cuda {
namespace {

using namespace bwd;

constexpr int kColumns = 8;  // state columns a CTA

// CTA: (sequence, value head) x a block of kColumns columns x direction
// (blockIdx.z 0: the gradient chain, kGrad); thread: one key row. A step is one
// dependent load latency: a thread loads its row of M_j (or of M_jᵀ) and its
// local values before the product.
template <bool kGrad>
__device__ __forceinline__ void scan_pieces(const BackwardArgs& a, float (&x_s)[kDim][kColumns]) {
  constexpr bool grad = kGrad;
  const ForwardArgs& f = a.f;
  const int64_t n = int64_t(blockIdx.x) / f.HV, hv = int64_t(blockIdx.x) % f.HV;
  const int c0 = int(blockIdx.y) * kColumns;
  const SequenceRange seq = sequence_range(f.cu_seqlens, f.cu_seqlens_int64, f.T, n);
  const int64_t P = sequence_piece_count(seq.eos - seq.bos, a.piece_chunks);
  if (P < 3) return;  // no piece between the first and the last: the first pass left everything
  const int r = threadIdx.x;
  auto row = [&](int64_t j, int kind) {  // this thread's kColumns values of a piece state
    return reinterpret_cast<float4*>(piece_state(a, n, j, hv, kind) + r * kDim + c0);
  };
  float4 lo, hi;
  {
    const float4* const x0 = grad ? row(P - 2, kBwdGradEnd) : row(1, kBwdStateStart);
    lo = x0[0], hi = x0[1];
  }
  for (int64_t step = 1; step <= P - 2; ++step) {
    const int64_t j = grad ? P - 1 - step : step;  // the piece whose transition this step applies
    __syncthreads();  // the previous step's reads of x_s are done
    reinterpret_cast<float4*>(x_s[r])[0] = lo;
    reinterpret_cast<float4*>(x_s[r])[1] = hi;
    const float* const m = piece_state(a, n, j, hv, kBwdTransition);
    float mr[kDim];  // row r of M_j (state) or of M_jᵀ (gradient)
#pragma unroll
    for (int k = 0; k < kDim; ++k) mr[k] = grad ? m[k * kDim + r] : m[r * kDim + k];
    const float4* const local = row(j, grad ? kBwdGradLocal : kBwdStateLocal);
    float4 acc_lo = local[0], acc_hi = local[1];
    __syncthreads();  // x_s written
    piece_scan_row_step(mr, x_s, acc_lo, acc_hi);
    lo = acc_lo, hi = acc_hi;
    float4* const out = grad ? row(j - 1, kBwdGradEnd) : row(j + 1, kBwdStateStart);
    out[0] = lo, out[1] = hi;
  }
}

__global__ void __launch_bounds__(kDim) gdn_bwd_tc_piece_scan_kernel(const BackwardArgs a) {
  __shared__ __align__(16) float x_s[kDim][kColumns];
  if (blockIdx.z == 0) {
    scan_pieces<true>(a, x_s);
  } else {
    scan_pieces<false>(a, x_s);
  }
}

}  // namespace

cudaError_t launch_gdn_bwd_tc_piece_scan(const BackwardArgs& args, cudaStream_t stream) {
  if (args.f.N * args.f.HV == 0 || args.piece_chunks == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(args.f.N * args.f.HV), kDim / kColumns, 2);
  gdn_bwd_tc_piece_scan_kernel<<<grid, kDim, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
