// Development tool: the fused forward kernel's per-chunk latency. Times five
// launches of each shape with CUDA events (after one untimed launch) and
// compares o with the simple kernel's on the same inputs. It includes the kernel's
// source and calls launch_gdn_fwd_fused only, so one build of this file times any
// version of the kernel (scripts/gpu.sh compare builds it against each version's
// src/). For the time of each phase use Nsight Compute on it (scripts/gpu.sh ncu).
// On the GPU machine:
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -O3 --expt-relaxed-constexpr -Iinclude -Isrc \
//     -Ithird_party/cutlass/include \
//     benchmarks/tools/fused_chunk_latency.cu src/cuda/sm90/gdn_fwd_simple_sm90.cu -o /tmp/fused_chunk_latency
//   /tmp/fused_chunk_latency          (every shape; "/tmp/fused_chunk_latency 2,3" only those)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda/sm90/gdn_fwd_fused_sm90.cu"
#include "cuda/sm90/gdn_fwd_simple_sm90.h"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void run(int64_t B, int64_t T, int64_t H, int64_t HV, bool l2norm = false) {
  using flashqla::cuda::ForwardArgs;
  const int64_t D = 128;
  // Inputs from a counter-based hash (uniform, the std of N(0, s²)): fast enough
  // for a billion elements on the host.
  uint64_t stream = 0;
  auto uniform = [&stream](int64_t i) {
    uint64_t z = (uint64_t(i) + 0x9e3779b97f4a7c15ull * ++stream) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
    return float((z ^ (z >> 29)) >> 40) * (1.f / 16777216.f);  // [0, 1)
  };
  auto bf16 = [&](int64_t count, float s) {
    std::vector<__nv_bfloat16> h(count);
    const uint64_t base = stream++;
    for (int64_t i = 0; i < count; ++i) h[i] = __float2bfloat16((uniform(i + int64_t(base << 40)) - 0.5f) * 3.4641f * s);
    void* d;
    check(cudaMalloc(&d, count * 2), "malloc");
    check(cudaMemcpy(d, h.data(), count * 2, cudaMemcpyHostToDevice), "copy");
    return d;
  };
  auto f32 = [&](int64_t count, float lo, float hi) {
    std::vector<float> h(count);
    const uint64_t base = stream++;
    for (int64_t i = 0; i < count; ++i) h[i] = lo + (hi - lo) * uniform(i + int64_t(base << 40));
    void* d;
    check(cudaMalloc(&d, count * 4), "malloc");
    check(cudaMemcpy(d, h.data(), count * 4, cudaMemcpyHostToDevice), "copy");
    return d;
  };
  ForwardArgs a{};
  a.T = T, a.H = H, a.HV = HV, a.K = D, a.V = D, a.N = B, a.group = HV / H, a.scale = 0.0883883f;
  a.q = bf16(B * T * H * D, 0.09f), a.q_sb = T * H * D, a.q_st = H * D, a.q_sh = D;
  a.k = bf16(B * T * H * D, 0.09f), a.k_sb = T * H * D, a.k_st = H * D, a.k_sh = D;
  a.v = bf16(B * T * HV * D, 1.f), a.v_sb = T * HV * D, a.v_st = HV * D, a.v_sh = D;
  a.token_dtype = FLASHQLA_DTYPE_BFLOAT16;
  a.use_qk_l2norm = l2norm;
  a.g = f32(B * T * HV, -0.1f, -0.001f), a.g_sb = T * HV, a.g_st = HV, a.g_dtype = FLASHQLA_DTYPE_FLOAT32;
  a.beta = f32(B * T * HV, 0.f, 1.f), a.beta_sb = T * HV, a.beta_st = HV, a.beta_dtype = FLASHQLA_DTYPE_FLOAT32;
  void* o;
  check(cudaMalloc(&o, B * T * HV * D * 2), "malloc");
  a.o = o, a.o_sb = T * HV * D, a.o_st = HV * D, a.o_sh = D, a.o_dtype = FLASHQLA_DTYPE_BFLOAT16;
  std::printf("B=%lld T=%lld H=%lld HV=%lld%s\n", (long long)B, (long long)T, (long long)H, (long long)HV,
              l2norm ? " l2norm" : "");
  check(flashqla::cuda::launch_gdn_fwd_fused(a, nullptr), "launch");
  check(cudaDeviceSynchronize(), "sync");
  // Timed: kTimedLaunches launches after the one above, each between its own
  // events (the mean is the figure; the min shows how far the launches spread).
  constexpr int kTimedLaunches = 5;
  cudaEvent_t e[kTimedLaunches + 1];
  for (auto& ev : e) cudaEventCreate(&ev);
  cudaEventRecord(e[0]);
  for (int i = 0; i < kTimedLaunches; ++i) {
    check(flashqla::cuda::launch_gdn_fwd_fused(a, nullptr), "launch");
    cudaEventRecord(e[i + 1]);
  }
  check(cudaDeviceSynchronize(), "sync");
  float total = 0, fastest = 1e30f;
  for (int i = 0; i < kTimedLaunches; ++i) {
    float ms = 0;
    cudaEventElapsedTime(&ms, e[i], e[i + 1]);
    total += ms;
    fastest = std::min(fastest, ms);
  }
  const float ms = total / kTimedLaunches;
  std::printf("  %.3f ms, %.2f us per chunk of one CTA's chain (mean of %d launches, min %.3f ms)\n", ms,
              1000.0 * ms / ((T + 63) / 64), kTimedLaunches, fastest);
  const int64_t count = B * T * HV * D;
  std::vector<__nv_bfloat16> fused(count), simple(count);
  check(cudaMemcpy(fused.data(), o, count * 2, cudaMemcpyDeviceToHost), "copy");
  check(flashqla::cuda::launch_gdn_fwd_simple(a, nullptr), "launch simple");
  check(cudaMemcpy(simple.data(), o, count * 2, cudaMemcpyDeviceToHost), "copy");
  double num = 0, den = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double x = __bfloat162float(fused[i]), y = __bfloat162float(simple[i]);
    num += (x - y) * (x - y);
    den += y * y;
  }
  std::printf("  relative difference to the simple kernel: %.2e\n", std::sqrt(num / den));
}

}  // namespace

// The shapes, in order; an argument "i,j,..." runs only those (for a profiler such as ncu).
int main(int argc, char** argv) {
  struct Shape {
    int64_t B, T, H, HV;
    bool l2norm;
  };
  const Shape shapes[] = {
      {1, 8192, 1, 1, false},    // one chain: the per-chunk latency
      {2, 1000, 1, 2, false},    // short chains with a partial last chunk
      {4, 8192, 16, 64, false},  // 256 chains: two waves on 132 SMs
      {4, 8192, 16, 32, false},  // 128 chains: one wave
      {2, 1000, 1, 2, true},     // the rows' preparation in the producer (q/k l2norm, a partial last chunk)
  };
  const int n = int(sizeof(shapes) / sizeof(shapes[0]));
  std::vector<int> pick;
  if (argc > 1) {
    for (const char* p = argv[1]; *p;) {
      char* end;
      const long i = std::strtol(p, &end, 10);
      if (end == p || i < 0 || i >= n) {
        std::fprintf(stderr, "usage: %s [shape indices 0..%d, comma-separated]\n", argv[0], n - 1);
        return 2;
      }
      pick.push_back(int(i));
      p = *end == ',' ? end + 1 : end;
    }
  } else {
    for (int i = 0; i < n; ++i) pick.push_back(i);
  }
  for (int i : pick) run(shapes[i].B, shapes[i].T, shapes[i].H, shapes[i].HV, shapes[i].l2norm);
  return 0;
}
