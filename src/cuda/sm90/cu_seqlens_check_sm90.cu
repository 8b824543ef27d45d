#include "cuda/sm90/cu_seqlens_check_sm90.h"

#include <cute/tensor.hpp>

namespace flashqla::cuda {
namespace {

constexpr int kThreads = 256;

// One CTA walks the N + 1 boundaries; each thread checks its own pairs and
// the bits are OR-reduced in shared memory before one thread writes them.
template <typename Index>
__global__ void __launch_bounds__(kThreads) check_cu_seqlens_kernel(const Index* cu_seqlens,
                                                                    int64_t N, int64_t T,
                                                                    uint32_t* result) {
  __shared__ uint32_t issues;
  if (threadIdx.x == 0) issues = kCuSeqlensOk;
  __syncthreads();
  auto cu = cute::make_tensor(cute::make_gmem_ptr(cu_seqlens), cute::make_layout(N + 1));
  uint32_t mine = kCuSeqlensOk;
  for (int64_t i = threadIdx.x; i <= N; i += kThreads) {
    const int64_t x = int64_t(cu(i));
    if (i == 0 && x != 0) mine |= kCuSeqlensBadStart;
    if (i > 0 && x < int64_t(cu(i - 1))) mine |= kCuSeqlensDecreasing;
    if (i == N && x != T) mine |= kCuSeqlensBadEnd;
  }
  if (mine != kCuSeqlensOk) atomicOr(&issues, mine);
  __syncthreads();
  if (threadIdx.x == 0) *result = issues;
}

}  // namespace

cudaError_t launch_check_cu_seqlens(const void* cu_seqlens, bool is_int64, int64_t N, int64_t T,
                                    uint32_t* result, cudaStream_t stream) {
  if (is_int64) {
    check_cu_seqlens_kernel<<<1, kThreads, 0, stream>>>(static_cast<const int64_t*>(cu_seqlens), N,
                                                        T, result);
  } else {
    check_cu_seqlens_kernel<<<1, kThreads, 0, stream>>>(static_cast<const int32_t*>(cu_seqlens), N,
                                                        T, result);
  }
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
