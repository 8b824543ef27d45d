// Development tool: what issuing the fused forward's wgmma batches costs the
// issuing warps, and when a batch completes, for the shapes the kernel uses and
// the merged or trimmed shapes that could replace them. One warpgroup issues,
// from 128-byte swizzled K-major tiles as the kernel's q/k stages are (K and Q
// as one [128 rows][128] tile, K rows ..63, Q rows 64..):
//   producer, both operands from shared memory:
//   - K Kᵀ alone: 8 wgmma m64n64k16,
//   - K Kᵀ and Q Kᵀ (the producer at v3.17): 16 wgmma m64n64k16, two accumulators,
//   - K [K; Q]ᵀ: 8 wgmma m64n128k16 (K Kᵀ and Pᵀ = K Qᵀ in one accumulator),
//   state warpgroups, A (Sᵀ, V_newᵀ) from registers:
//   - step 1 at v3.17, Sᵀ Kᵀ and Sᵀ Qᵀ: 16 wgmma m64n64k16, two accumulators,
//   - step 1 merged, Sᵀ [K; Q]ᵀ: 8 wgmma m64n128k16, one accumulator,
//   - Oᵀ += V_newᵀ Pᵀ at v3.17: 4 wgmma m64n64k16,
//   - the same trimmed to P's lower triangle: 10 wgmma m64n16k16 (token block
//     n takes key blocks ..n; accumulators disjoint),
// and records the cycles from the batch's first fence to its commit (issue) and
// to the end of its wait (complete), alone and with two more warpgroups keeping
// the tensor pipe busy (batches of 8 wgmma m64n128k16, as the state warpgroups'
// steps). Target wgmma_issue of the library's CMake project with
// -DFLASHQLA_BUILD_TOOLS=ON; on the GPU machine `scripts/gpu.sh iterate` (and
// `compare --wgmma-issue`) builds and runs it.
#include <cstdio>

#include "cuda/sm90/warpgroup_mma.cuh"

namespace {

using flashqla::cuda::mma::Swizzled128Tile;
namespace wg = flashqla::cuda::wgmma;
using T = __nv_bfloat16;

enum Variant { kKKt, kKKtQKt, kMerged, kStep1, kStep1Merged, kOutput, kOutputTriangular, kVariants };
const char* const kNames[] = {"K Kt alone, 8 x m64n64k16 SS          ", "K Kt and Q Kt, 16 x m64n64k16 SS      ",
                              "K [K; Q]t, 8 x m64n128k16 SS          ", "step 1, 16 x m64n64k16 RS             ",
                              "step 1 merged, 8 x m64n128k16 RS      ", "O += V P, 4 x m64n64k16 RS            ",
                              "O += V P triangular, 10 x m64n16k16 RS"};

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

// Columns 8 j0.. of an accumulator as an accumulator of N columns.
template <int N>
__device__ __forceinline__ float (&columns(float* acc, int j0))[N / 2] {
  return *reinterpret_cast<float(*)[N / 2]>(acc + 4 * j0);
}

// One batch of the variant into acc (64 floats a thread), A fragments (RS) from a.
template <int kVariant>
__device__ __forceinline__ void issue_batch(const Swizzled128Tile<T, 128>& kq, const uint32_t (&a)[8][4], float* acc) {
  const Swizzled128Tile<T, 128> q{kq.base + 64 * 64};  // Q's rows of the same tile
  if constexpr (kVariant == kKKt || kVariant == kKKtQKt) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      wg::mma_ss<T, 64, wg::kK, wg::kK>(wg::kmajor_desc(kq, 16 * k), wg::kmajor_desc(kq, 16 * k), columns<64>(acc, 0));
    if constexpr (kVariant == kKKtQKt) {
#pragma unroll
      for (int k = 0; k < 8; ++k)
        wg::mma_ss<T, 64, wg::kK, wg::kK>(wg::kmajor_desc(q, 16 * k), wg::kmajor_desc(kq, 16 * k), columns<64>(acc, 8));
    }
  } else if constexpr (kVariant == kMerged) {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      wg::mma_ss<T, 128, wg::kK, wg::kK>(wg::kmajor_desc(kq, 16 * k), wg::kmajor_desc(kq, 16 * k), columns<128>(acc, 0));
  } else if constexpr (kVariant == kStep1) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      wg::mma<T, 64>(a[k], wg::kmajor_desc(kq, 16 * k), columns<64>(acc, 0));
      wg::mma<T, 64>(a[k], wg::kmajor_desc(q, 16 * k), columns<64>(acc, 8));
    }
  } else if constexpr (kVariant == kStep1Merged) {
#pragma unroll
    for (int k = 0; k < 8; ++k) wg::mma<T, 128>(a[k], wg::kmajor_desc(kq, 16 * k), columns<128>(acc, 0));
  } else if constexpr (kVariant == kOutput) {
#pragma unroll
    for (int k = 0; k < 4; ++k) wg::mma<T, 64>(a[k], wg::kmajor_desc(kq, 16 * k), columns<64>(acc, 0));
  } else {
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int k = 0; k <= n; ++k) wg::mma<T, 16>(a[k], wg::kmajor_desc(kq, 16 * k, 16 * n), columns<16>(acc, 2 * n));
    }
  }
}

// The issuer's batches (thread 0 records the mean cycles).
template <int kVariant>
__device__ void issue_batches(unsigned char* smem, long long* cycles, int tid) {
  const Swizzled128Tile<T, 128> kq{reinterpret_cast<T*>(smem)};
  uint32_t a[8][4];
#pragma unroll
  for (int k = 0; k < 8; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[k][r] = 0x3c003c00u ^ uint32_t(tid * 8 + k * 4 + r);
  float acc[64];
  long long issue = 0, complete = 0;
  for (int it = 0; it < kIters; ++it) {
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    const long long t0 = clock64();
    wg::fence(acc);
    issue_batch<kVariant>(kq, a, acc);
    wg::commit();
    const long long t1 = clock64();
    wg::wait<0>();
    wg::fence_operands(acc);
    const long long t2 = clock64();
    issue += t1 - t0;
    complete += t2 - t0;
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) s += acc[i];
  if (tid == 0) {
    cycles[0] = issue / kIters;
    cycles[1] = complete / kIters + (s == 12345.f ? 1 : 0);
  }
}

template <int... kV>
__device__ void run_variant(int variant, unsigned char* smem, long long* cycles, int tid,
                            std::integer_sequence<int, kV...>) {
  ((variant == kV ? issue_batches<kV>(smem, cycles, tid) : void()), ...);
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
  run_variant(variant, smem, cycles, tid, std::make_integer_sequence<int, kVariants>{});
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
