// Development tool: does instruction fetch limit long straight-line loop
// bodies? Each warp runs a fully unrolled block of 2048 independent-chain FFMAs
// (32 KB of code) per iteration; with one warp per scheduler the block should
// take ≈ 2048 cycles if instructions arrive in time. Rows: warps per scheduler
// and how many distinct copies of the block (code streams) they run.
// Target icache_rate of the library's CMake project with -DFLASHQLA_BUILD_TOOLS=ON:
//   cmake --build build-gpu --target icache_rate && build-gpu/benchmarks/tools/icache_rate
#include <cstdio>

namespace {

constexpr int kIters = 32;

template <int kSalt, int kLength>
__device__ __forceinline__ float straight_block(float x) {
  float a[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] = x + j;
#pragma unroll
  for (int i = 0; i < kLength / 8; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] = fmaf(a[j], 0.999f, 1e-7f * float(i * 8 + j + 1 + 4096 * kSalt));
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += a[j];
  return s;
}

template <int kLength>
__global__ void icache_kernel(int streams, float seed, float* sink, long long* cycles) {
  const int warp = threadIdx.x / 32, role = (warp / 4) % streams;
  float x = seed + threadIdx.x;
  const long long start = clock64();
  for (int it = 0; it < kIters; ++it) {
    switch (role) {
      case 0: x = straight_block<0, kLength>(x); break;
      case 1: x = straight_block<1, kLength>(x); break;
      default: x = straight_block<2, kLength>(x); break;
    }
  }
  const long long end = clock64();
  if (threadIdx.x % 32 == 0) cycles[warp] = (end - start) / kIters;
  if (x == 12345.f) sink[threadIdx.x] = x;
}

template <int kLength>
void run_length() {
  long long* d;
  float* sink;
  cudaMalloc(&d, 16 * sizeof(long long));
  cudaMalloc(&sink, 512 * sizeof(float));
  std::printf("block of %d FFMA (%d KB of code):\n", kLength, kLength * 16 / 1024);
  const int configs[][2] = {{1, 1}, {2, 1}, {2, 2}, {3, 1}, {3, 3}};
  for (const auto& c : configs) {
    icache_kernel<kLength><<<1, 128 * c[0]>>>(c[1], 1.f, sink, d);
    long long h[16] = {};
    cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
    long long worst = 0;
    for (int w = 0; w < 4 * c[0]; ++w) worst = h[w] > worst ? h[w] : worst;
    std::printf("  %d warp(s) a scheduler, %d code stream(s): %lld cycles a block (%.2f a warp instruction)\n", c[0],
                c[1], worst, double(worst) / (kLength * c[0]));
  }
  cudaFree(d);
  cudaFree(sink);
}

}  // namespace

int main() {
  run_length<512>();
  run_length<1024>();
  run_length<2048>();
  run_length<4096>();
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("%s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
