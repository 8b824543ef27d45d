// Development tool: cycles of one batch of eight wgmma m64n128k16 (bf16, fp32
// accumulate) for each operand layout the fused forward uses, with one or two
// warpgroups issuing at once, each waiting for its batch (as the state chain
// does). Target wgmma_rate of the library's CMake project with
// -DFLASHQLA_BUILD_TOOLS=ON; on the GPU machine `scripts/gpu.sh iterate` builds
// and runs it.
#include <cstdio>

#include "cuda/sm90/warpgroup_mma.cuh"

namespace {

using flashqla::cuda::mma::CoreTile;
namespace wg = flashqla::cuda::wgmma;
using T = __nv_bfloat16;

enum Variant { kSS_K_MN, kSS_K_K, kSS_MN_MN, kRS_MN, kRS_K, kVariants };
const char* const kNames[] = {"A smem K-major,  B MN-major", "A smem K-major,  B K-major ",
                              "A smem MN-major, B MN-major", "A registers,     B MN-major",
                              "A registers,     B K-major "};

constexpr int kIters = 256;

// Operand placement: each warpgroup its own A and B (kOwn), or as the fused
// forward's step 2 (kShared: A at byte 0 and 0x1C000, one B at 0x20000 read by
// both, 231936 bytes of shared memory).
enum Placement { kOwn, kShared };

__global__ void rate_kernel(int variant, int placement, int random_data, long long* cycles) {
  extern __shared__ __align__(128) unsigned char smem[];
  // A [64][128] and B [128][128] core-matrix tiles per warpgroup.
  const int wgi = threadIdx.x / 128, tid = threadIdx.x % 128, lane = threadIdx.x % 32, warp = tid / 32;
  T* base = reinterpret_cast<T*>(smem) + wgi * (64 * 128 + 128 * 128);
  T* a_base = base;
  T* b_base = base + 64 * 128;
  if (placement == kShared) {
    a_base = reinterpret_cast<T*>(smem + (wgi == 0 ? 0x1C000 : 0));
    b_base = reinterpret_cast<T*>(smem + 0x20000);
  }
  for (int i = tid; i < 64 * 128; i += 128) {
    const unsigned h = (i * 2654435761u + wgi * 97u) >> 16;
    a_base[i] = __float2bfloat16(random_data ? (h % 2001) / 1000.f - 1.f : 0.001f * (i % 7));
  }
  for (int i = tid; i < 128 * 128; i += 128) {
    const unsigned h = (i * 2246822519u) >> 16;
    b_base[i] = __float2bfloat16(random_data ? (h % 2001) / 1000.f - 1.f : 0.001f * (i % 7));
  }
  const CoreTile<T, 128> a{a_base}, b{b_base};
  wg::fence_shared_for_async();
  __syncthreads();
  float acc[64];
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  uint32_t af[8][4];
  for (int k = 0; k < 8; ++k) flashqla::cuda::mma::load_a(af[k], a, 16 * warp, 16 * k, lane);
  long long start = clock64();
  for (int it = 0; it < kIters; ++it) {
    wg::fence(acc);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      switch (variant) {
        case kSS_K_MN: wg::mma_ss<T, 128, wg::kK, wg::kMN>(wg::kmajor_desc(a, 16 * k), wg::mnmajor_desc(b, 16 * k), acc); break;
        case kSS_K_K: wg::mma_ss<T, 128, wg::kK, wg::kK>(wg::kmajor_desc(a, 16 * k), wg::kmajor_desc(b, 16 * k), acc); break;
        case kSS_MN_MN: wg::mma_ss<T, 128, wg::kMN, wg::kMN>(wg::mnmajor_desc(b, 16 * k), wg::mnmajor_desc(b, 16 * k), acc); break;
        case kRS_MN: wg::mma_b_mn<T, 128>(af[k], wg::mnmajor_desc(b, 16 * k), acc); break;
        default: wg::mma<T, 128>(af[k], wg::kmajor_desc(b, 16 * k), acc); break;
      }
    }
    wg::commit_and_wait(acc);
  }
  long long end = clock64();
  float s = 0.f;
  for (int i = 0; i < 64; ++i) s += acc[i];
  if (tid == 0) cycles[wgi] = (end - start) / kIters + (s == 12345.f ? 1 : 0);
}

}  // namespace

int main() {
  long long* d;
  cudaMalloc(&d, 2 * sizeof(long long));
  const int smem = 231936;
  cudaFuncSetAttribute(rate_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  std::printf("cycles per batch of 8 wgmma m64n128k16 (ideal: 8 x 64 = 512 for one warpgroup at the SM's peak)\n");
  for (int v = 0; v < kVariants; ++v) {
    for (int groups = 1; groups <= 2; ++groups) {
      rate_kernel<<<1, 128 * groups, smem>>>(v, kOwn, 0, d);
      long long h[2] = {};
      cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
      std::printf("  %s, %d warpgroup(s): %lld\n", kNames[v], groups, h[0]);
    }
  }
  std::printf("A smem K-major, B MN-major, 2 warpgroups, placement and data:\n");
  for (int placement = kOwn; placement <= kShared; ++placement) {
    for (int random_data = 0; random_data <= 1; ++random_data) {
      rate_kernel<<<1, 256, smem>>>(kSS_K_MN, placement, random_data, d);
      long long h[2] = {};
      cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost);
      std::printf("  %s B, %s data: %lld %lld\n", placement == kOwn ? "own   " : "shared", random_data ? "random" : "small ",
                  h[0], h[1]);
    }
  }
  const cudaError_t e = cudaDeviceSynchronize();
  std::printf("%s\n", cudaGetErrorString(e));
  return e == cudaSuccess ? 0 : 1;
}
