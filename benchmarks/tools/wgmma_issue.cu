// Development tool: what issuing the fused forward producer's wgmma batch costs
// the issuing warps, and when the batch completes. One warpgroup issues, from
// 128-byte swizzled K-major tiles as the producer's q/k stages are, either
//   - K Kᵀ alone: 8 wgmma m64n64k16,
//   - K Kᵀ and Q Kᵀ (the producer at v3.17): 16 wgmma m64n64k16, two accumulators,
//   - K [K; Q]ᵀ: 8 wgmma m64n128k16 (K Kᵀ and Pᵀ = K Qᵀ in one accumulator; K and
//     Q as one [128 rows][128] tile),
// and records the cycles from the batch's first fence to its commit (issue) and
// to the end of its wait (complete), alone and with two more warpgroups keeping
// the tensor pipe busy (batches of 8 wgmma m64n128k16, as the state warpgroups'
// steps). On the GPU machine:
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 -Iinclude -Isrc -Ithird_party/cutlass/include \
//     benchmarks/tools/wgmma_issue.cu -o /tmp/wgmma_issue && /tmp/wgmma_issue
#include <cstdio>

#include "cuda/sm90/warpgroup_mma.cuh"

namespace {

using flashqla::cuda::mma::Swizzled128Tile;
namespace wg = flashqla::cuda::wgmma;
using T = __nv_bfloat16;

enum Variant { kKKt, kKKtQKt, kMerged, kVariants };
const char* const kNames[] = {"K Kt alone, 8 x m64n64k16      ", "K Kt and Q Kt, 16 x m64n64k16  ",
                              "K [K; Q]t, 8 x m64n128k16      "};

constexpr int kIters = 64;
constexpr int kTileBytes = 64 * 128 * 2;  // [64][128] 16-bit
// Shared memory: K and Q of the issuer as one [128][128] tile (K rows ..63, Q
// rows 64..), then each background warpgroup's A [64][128] and B [128][128].
constexpr int kOffBackground = 2 * kTileBytes;
constexpr int kBackgroundBytes = 3 * kTileBytes;
constexpr int kOffStop = kOffBackground + 2 * kBackgroundBytes;
constexpr int kSmemBytes = kOffStop + 16;

__device__ void fill(T* p, int n, unsigned seed, int tid, int threads) {
  for (int i = tid; i < n; i += threads) {
    const unsigned h = (i * 2654435761u + seed * 97u) >> 16;
    p[i] = __float2bfloat16((h % 2001) / 1000.f - 1.f);
  }
}

// The issuer's batches (thread 0 records the mean cycles).
template <int kVariant>
__device__ void issue_batches(unsigned char* smem, long long* cycles, int tid) {
  const Swizzled128Tile<T, 128> kq{reinterpret_cast<T*>(smem)};  // K rows ..63, Q rows 64..
  const Swizzled128Tile<T, 64> k_only{reinterpret_cast<T*>(smem)};
  constexpr int kAcc = kVariant == kMerged ? 64 : 32;
  float acc[kAcc], acc_q[32];
  long long issue = 0, complete = 0;
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) acc_q[i] = 0.f;
    const long long t0 = clock64();
    wg::fence_operands(acc_q);
    wg::fence(acc);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      if constexpr (kVariant == kMerged)
        wg::mma_ss<T, 128, wg::kK, wg::kK>(wg::kmajor_desc(k_only, 16 * k), wg::kmajor_desc(kq, 16 * k), acc);
      else
        wg::mma_ss<T, 64, wg::kK, wg::kK>(wg::kmajor_desc(k_only, 16 * k), wg::kmajor_desc(k_only, 16 * k), acc);
    }
    if constexpr (kVariant == kKKtQKt) {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        wg::mma_ss<T, 64, wg::kK, wg::kK>(wg::kmajor_desc(kq, 16 * k, 64), wg::kmajor_desc(k_only, 16 * k), acc_q);
    }
    wg::commit();
    const long long t1 = clock64();
    wg::wait<0>();
    wg::fence_operands(acc);
    wg::fence_operands(acc_q);
    const long long t2 = clock64();
    issue += t1 - t0;
    complete += t2 - t0;
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kAcc; ++i) s += acc[i];
#pragma unroll
  for (int i = 0; i < 32; ++i) s += acc_q[i];
  if (tid == 0) {
    cycles[0] = issue / kIters;
    cycles[1] = complete / kIters + (s == 12345.f ? 1 : 0);
  }
}

__global__ void __launch_bounds__(384, 1) issue_kernel(int variant, long long* cycles) {
  extern __shared__ __align__(1024) unsigned char smem[];
  volatile int* const stop = reinterpret_cast<int*>(smem + kOffStop);
  const int wgi = threadIdx.x / 128, tid = threadIdx.x % 128;
  fill(reinterpret_cast<T*>(smem), (kOffStop) / 2, 7u, threadIdx.x, blockDim.x);
  if (threadIdx.x == 0) *stop = 0;
  wg::fence_shared_for_async();
  __syncthreads();
  if (wgi > 0) {  // background: the tensor pipe kept busy until the issuer is done
    const Swizzled128Tile<T, 64> a{reinterpret_cast<T*>(smem + kOffBackground + (wgi - 1) * kBackgroundBytes)};
    const Swizzled128Tile<T, 128> b{reinterpret_cast<T*>(smem + kOffBackground + (wgi - 1) * kBackgroundBytes +
                                                          kTileBytes)};
    float acc[64];
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    while (*stop == 0) {
      wg::fence(acc);
#pragma unroll
      for (int k = 0; k < 8; ++k)
        wg::mma_ss<T, 128, wg::kK, wg::kK>(wg::kmajor_desc(a, 16 * k), wg::kmajor_desc(b, 16 * k), acc);
      wg::commit_and_wait(acc);
    }
    float s = 0.f;
    for (int i = 0; i < 64; ++i) s += acc[i];
    if (s == 12345.f) cycles[2] = 1;  // keeps the background's work
    return;
  }
  if (variant == kKKt) issue_batches<kKKt>(smem, cycles, tid);
  else if (variant == kKKtQKt) issue_batches<kKKtQKt>(smem, cycles, tid);
  else issue_batches<kMerged>(smem, cycles, tid);
  if (tid == 0) *stop = 1;
}

}  // namespace

int main() {
  long long* d;
  cudaMalloc(&d, 3 * sizeof(long long));
  cudaFuncSetAttribute(issue_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  std::printf("cycles per batch of the issuing warpgroup (thread 0): issue = first fence to commit, complete = "
              "to the end of the wait\n");
  for (int v = 0; v < kVariants; ++v) {
    for (int groups = 1; groups <= 3; groups += 2) {
      issue_kernel<<<1, 128 * groups, kSmemBytes>>>(v, d);
      long long h[3] = {};
      cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
      std::printf("  %s %s: issue %5lld, complete %5lld\n", kNames[v],
                  groups == 1 ? "alone         " : "+2 busy groups", h[0], h[1]);
    }
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("%s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
