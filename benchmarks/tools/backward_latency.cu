// Development tool: the CUDA backward's time through the C API, next to the
// forward's on the same inputs, for shapes of the published backward table
// (K = V = 128, bf16, packed sequences of equal length, h0 and dht given).
// Inputs come from a counter-based hash; nothing is compared (the GPU suite
// checks results). scripts/gpu.sh iterate builds and runs it.
//   backward_latency                 every shape
//   backward_latency 0,2             only those
// REPS=n timed calls a shape (3); L2NORM=0 without the in-kernel l2norm.
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "flashqla/flashqla.h"

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

void check(flashqla_status_t s, const char* what) {
  if (s != FLASHQLA_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", what, flashqla_last_error_message());
    std::exit(1);
  }
}

float uniform(uint64_t i, uint64_t stream) {
  uint64_t z = (i + 0x9e3779b97f4a7c15ull * (stream + 1)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 31)) * 0x94d049bb133111ebull;
  return float((z ^ (z >> 29)) >> 40) * (1.f / 16777216.f);  // [0, 1)
}

struct Buffers {
  std::vector<void*> owned;
  ~Buffers() {
    for (void* p : owned) cudaFree(p);
  }
  void* alloc(size_t bytes) {
    void* d = nullptr;
    check(cudaMalloc(&d, bytes == 0 ? 1 : bytes), "cudaMalloc");
    owned.push_back(d);
    return d;
  }
  // bf16 uniform with the std of N(0, s²), or fp32 in [lo, hi).
  void* bf16(int64_t n, float s, uint64_t stream) {
    std::vector<__nv_bfloat16> h(n);
    for (int64_t i = 0; i < n; ++i) h[i] = __float2bfloat16((uniform(i, stream) - 0.5f) * 3.4641f * s);
    void* d = alloc(n * 2);
    check(cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice), "copy");
    return d;
  }
  void* f32(int64_t n, float lo, float hi, uint64_t stream) {
    std::vector<float> h(n);
    for (int64_t i = 0; i < n; ++i) h[i] = lo + (hi - lo) * uniform(i, stream);
    void* d = alloc(n * 4);
    check(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice), "copy");
    return d;
  }
};

flashqla_tensor_t token_tensor(void* data, flashqla_dtype_t dtype, int64_t T, int64_t heads, int64_t dim) {
  return flashqla_tensor_t{data, dtype, {T * heads * dim, heads * dim, dim, 1}};
}

flashqla_tensor_t state_tensor(void* data, int64_t HV) {
  return flashqla_tensor_t{data, FLASHQLA_DTYPE_FLOAT32, {HV * 128 * 128, 128 * 128, 128, 1}};
}

struct Shape {
  const char* name;
  int64_t tokens, seqs, H, HV;
  int64_t first = 0;  // > 0: the first sequence's length (the rest split equally), else all equal
};

void run(const Shape& s, int reps) {
  const int64_t T = s.tokens, H = s.H, HV = s.HV, D = 128, N = s.seqs;
  Buffers b;
  std::vector<int32_t> cu(N + 1);
  for (int64_t n = 0; n <= N; ++n) cu[n] = int32_t(T * n / N);
  if (s.first > 0) {
    for (int64_t n = 1; n <= N; ++n) cu[n] = int32_t(s.first + (T - s.first) * (n - 1) / (N - 1 > 0 ? N - 1 : 1));
    cu[N] = int32_t(T);
  }
  void* cu_d = b.alloc(cu.size() * 4);
  check(cudaMemcpy(cu_d, cu.data(), cu.size() * 4, cudaMemcpyHostToDevice), "copy");

  flashqla_gdn_bwd_params_t p;
  flashqla_gdn_bwd_params_init(&p);
  flashqla_gdn_fwd_params_t& f = p.fwd;
  f.B = 1, f.T = T, f.H = H, f.HV = HV, f.K = D, f.V = D, f.N = N;
  f.q = token_tensor(b.bf16(T * H * D, 0.088f, 1), FLASHQLA_DTYPE_BFLOAT16, T, H, D);
  f.k = token_tensor(b.bf16(T * H * D, 0.088f, 2), FLASHQLA_DTYPE_BFLOAT16, T, H, D);
  f.v = token_tensor(b.bf16(T * HV * D, 1.f, 3), FLASHQLA_DTYPE_BFLOAT16, T, HV, D);
  f.g = flashqla_tensor_t{b.f32(T * HV, -0.2f, -0.01f, 4), FLASHQLA_DTYPE_FLOAT32, {T * HV, HV, 1, 0}};
  f.beta = flashqla_tensor_t{b.f32(T * HV, 0.2f, 0.9f, 5), FLASHQLA_DTYPE_FLOAT32, {T * HV, HV, 1, 0}};
  f.initial_state = state_tensor(b.f32(N * HV * D * D, -0.5f, 0.5f, 6), HV);
  f.initial_state_n = N;
  f.cu_seqlens = flashqla_tensor_t{cu_d, FLASHQLA_DTYPE_INT32, {1, 0, 0, 0}};
  f.cu_seqlens_host = cu.data();
  f.use_qk_l2norm = std::getenv("L2NORM") == nullptr || std::atoi(std::getenv("L2NORM")) != 0;
  p.d_o = token_tensor(b.bf16(T * HV * D, 1.f, 7), FLASHQLA_DTYPE_BFLOAT16, T, HV, D);
  p.d_final_state = state_tensor(b.f32(N * HV * D * D, -0.5f, 0.5f, 8), HV);
  p.dq = token_tensor(b.alloc(T * H * D * 2), FLASHQLA_DTYPE_BFLOAT16, T, H, D);
  p.dk = token_tensor(b.alloc(T * H * D * 2), FLASHQLA_DTYPE_BFLOAT16, T, H, D);
  p.dv = token_tensor(b.alloc(T * HV * D * 2), FLASHQLA_DTYPE_BFLOAT16, T, HV, D);
  p.dg = flashqla_tensor_t{b.alloc(T * HV * 4), FLASHQLA_DTYPE_FLOAT32, {T * HV, HV, 1, 0}};
  p.dbeta = flashqla_tensor_t{b.alloc(T * HV * 4), FLASHQLA_DTYPE_FLOAT32, {T * HV, HV, 1, 0}};
  p.d_initial_state = state_tensor(b.alloc(N * HV * D * D * 4), HV);

  size_t bwd_ws = 0;
  check(flashqla_gdn_bwd_workspace_size(&p, &bwd_ws), "bwd workspace size");
  p.fwd.workspace = b.alloc(bwd_ws);
  p.fwd.workspace_bytes = bwd_ws;

  // The forward (inference: o and the final state) on the same inputs.
  flashqla_gdn_fwd_params_t fp = f;
  fp.o = token_tensor(b.alloc(T * HV * D * 2), FLASHQLA_DTYPE_BFLOAT16, T, HV, D);
  fp.final_state = state_tensor(b.alloc(N * HV * D * D * 4), HV);
  fp.output_final_state = 1;
  size_t fwd_ws = 0;
  check(flashqla_gdn_fwd_workspace_size(&fp, &fwd_ws), "fwd workspace size");
  fp.workspace = b.alloc(fwd_ws);
  fp.workspace_bytes = fwd_ws;

  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  auto time = [&](auto&& call) {
    call();  // untimed: first-launch costs
    check(cudaDeviceSynchronize(), "sync");
    check(cudaEventRecord(e0), "record");
    for (int r = 0; r < reps; ++r) call();
    check(cudaEventRecord(e1), "record");
    check(cudaEventSynchronize(e1), "sync");
    float ms = 0.f;
    check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    return ms / reps;
  };
  const float bwd = time([&] { check(flashqla_gdn_bwd(&p), "flashqla_gdn_bwd"); });
  const float fwd = time([&] { check(flashqla_gdn_fwd(&fp), "flashqla_gdn_fwd"); });
  std::printf("%-22s tokens %6lld seqs %2lld H %2lld HV %2lld  bwd %8.3f ms  fwd %7.3f ms  bwd/fwd %5.1f  "
              "workspace %.1f MiB (%.0f B/token/head)\n",
              s.name, (long long)T, (long long)N, (long long)H, (long long)HV, bwd, fwd, bwd / fwd,
              bwd_ws / 1048576.0, double(bwd_ws) / double(T * HV));
  check(cudaEventDestroy(e0), "event");
  check(cudaEventDestroy(e1), "event");
}

}  // namespace

int main(int argc, char** argv) {
  const Shape shapes[] = {
      {"hk16_hv32 8k_1seq", 8192, 1, 16, 32},   {"hk16_hv32 8k_8seq", 8192, 8, 16, 32},
      {"hk16_hv32 32k_1seq", 32768, 1, 16, 32}, {"hk16_hv32 32k_8seq", 32768, 8, 16, 32},
      {"hk2_hv4 8k_1seq", 8192, 1, 2, 4},       {"hk2_hv4 32k_8seq", 32768, 8, 2, 4},
      {"hk2_hv4 32k_1seq", 32768, 1, 2, 4},     {"hk4_hv8 8k_1seq", 8192, 1, 4, 8},
      {"hk8_hv16 8k_2seq", 8192, 2, 8, 16},     {"hk4_hv8 32k_1seq", 32768, 1, 4, 8},
      {"hk2_hv4 8k_2seq", 8192, 2, 2, 4},       {"hk8_hv16 8k_1seq", 8192, 1, 8, 16},
      {"hk4_hv8 8k_2seq", 8192, 2, 4, 8},       {"hk2_hv4 32k_2seq", 32768, 2, 2, 4},
      // Few value heads (TP 8 of smaller models): where the chains' sequence pieces pay.
      {"hk1_hv1 8k_1seq", 8192, 1, 1, 1},       {"hk1_hv2 8k_1seq", 8192, 1, 1, 2},
      {"hk1_hv2 32k_1seq", 32768, 1, 1, 2},
      // FlashQLA's split of the published hk*_32k_2seq rows (benchmarks/bwd_rows.py).
      {"hk2_hv4 32k_2seq_uneven", 32768, 2, 2, 4, 7212},
  };
  const int count = int(sizeof(shapes) / sizeof(shapes[0]));
  std::vector<bool> pick(count, argc < 2);
  if (argc >= 2) {
    for (char* tok = std::strtok(argv[1], ","); tok; tok = std::strtok(nullptr, ",")) {
      const int i = std::atoi(tok);
      if (i >= 0 && i < count) pick[i] = true;
    }
  }
  const int reps = std::getenv("REPS") ? std::atoi(std::getenv("REPS")) : 3;
  for (int i = 0; i < count; ++i) {
    if (pick[i]) run(shapes[i], reps);
  }
  return 0;
}
