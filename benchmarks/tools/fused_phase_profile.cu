// Development tool: phase timing of the fused forward kernel. Builds the kernel
// with FLASHQLA_FUSED_PROFILE (cycles per phase of CTA 0, read back) and times five
// launches of each shape with CUDA events, and compares o with the simple
// kernel's on the same inputs. Built without the define, it times the kernel
// as built for the library. Targets of the library's CMake project with
// -DFLASHQLA_BUILD_TOOLS=ON (benchmarks/tools/CMakeLists.txt, the library's
// flags): fused_timing-current, fused_profile-current, ...; scripts/gpu.sh
// iterate and compare build and run them. On the GPU machine:
//   cmake --build build-gpu --target fused_profile-current
//   build-gpu/benchmarks/tools/fused_profile-current      (every shape; "... 2,3" only those)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
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
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto bf16 = [&](int64_t count, float s) {
    std::vector<__nv_bfloat16> h(count);
    for (auto& x : h) x = __float2bfloat16(nd(rng) * s);
    void* d;
    check(cudaMalloc(&d, count * 2), "malloc");
    check(cudaMemcpy(d, h.data(), count * 2, cudaMemcpyHostToDevice), "copy");
    return d;
  };
  auto f32 = [&](int64_t count, float lo, float hi) {
    std::vector<float> h(count);
    std::uniform_real_distribution<float> u(lo, hi);
    for (auto& x : h) x = u(rng);
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
#ifdef FLASHQLA_FUSED_PROFILE
  using flashqla::cuda::kProfileSlots;
  long long cycles[kProfileSlots] = {};
  check(cudaMemcpyToSymbol(flashqla::cuda::fused_profile_cycles, cycles, sizeof(cycles)), "reset");
#endif
  check(flashqla::cuda::launch_gdn_fwd_fused(a, nullptr), "launch");
  check(cudaDeviceSynchronize(), "sync");
#ifdef FLASHQLA_FUSED_PROFILE
  check(cudaMemcpyFromSymbol(cycles, flashqla::cuda::fused_profile_cycles, sizeof(cycles)), "read");
  const long long n = cycles[kProfileSlots - 1] > 0 ? cycles[kProfileSlots - 1] : 1;
  // Slots 16..18 and slot 7 on the producer's side exist from v3.14's finer
  // profile on; a version with fewer slots prints the ones it has.
  constexpr int kNamedSlots = 19;
  static const char* const names[kNamedSlots] = {
      "wait ready", "KS, QS first keys", "KS, QS other keys, V", "loads issued", "V', V_new", "O, S update",
      "O store", "16x16 blocks", "wait free", "Q, K landed, rows prepared", "A epilogue, barrier",
      "32x32 level, gates, barrier", "off-diagonal", "V landed", "gates", "ready", "K Kᵀ, Q Kᵀ waited",
      "P epilogue", "blocks' barrier"};
  // Slot order in time: the state warpgroups', then the producer's.
  static const int order[kNamedSlots] = {0, 1, 2, 4, 5, 6, 8, 3, 14, 9, 16, 17, 10, 7, 18, 11, 12, 13, 15};
  std::printf("  cycles per chunk (CTA 0, %lld chunks), state:", n);
  for (int k = 0; k < kNamedSlots; ++k) {
    const int i = order[k];
    if (i >= kProfileSlots - 1) continue;
    if (i == 8) std::printf("\n    producer:");
    std::printf(" %s %lld |", names[i], cycles[i] / n);
  }
  std::printf("\n");
#endif
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

// The shapes, in order; an argument "i,j,..." runs only those (for a profiler).
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
