// The CUDA backend through the C API: backend resolution from device
// pointers, device-only validation, and the device-side cu_seqlens debug
// check. Built only with the CUDA backend; skips (with the reason) where no
// CUDA device exists and runs wherever one does.
#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "test_support.h"

namespace flashqla_test {
namespace {

using ::testing::HasSubstr;

class CudaBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
    c.cu_seqlens = {0, 5, 5, 70};
    c.H = 1;
    c.HV = 2;
    c.K = 16;
    c.V = 16;
    c.dtype = FLASHQLA_DTYPE_BFLOAT16;
    c.gate_dtype = FLASHQLA_DTYPE_FLOAT32;
    c.state_dtype = FLASHQLA_DTYPE_FLOAT32;
    c.with_h0 = true;
    c.allocate_and_fill(3);
    for (HostTensor* t : {&c.q, &c.k, &c.v, &c.g, &c.beta, &c.h0, &c.o, &c.ht, &c.cu})
      dev.emplace_back(std::make_unique<DeviceTensor>(*t));
  }
  // Forward params over the device copies, in the order SetUp made them.
  flashqla_gdn_fwd_params_t device_params() {
    flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
    p.backend = FLASHQLA_BACKEND_AUTO;
    flashqla_tensor_t* slots[] = {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.initial_state, &p.o,
                                  &p.final_state, &p.cu_seqlens};
    for (size_t i = 0; i < dev.size(); ++i) *slots[i] = dev[i]->desc;
    return p;
  }
  void set_cu_seqlens(const std::vector<int32_t>& cu) {
    ASSERT_EQ(cudaMemcpy(dev.back()->ptr, cu.data(), cu.size() * sizeof(int32_t),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  GdnCase c;
  std::vector<std::unique_ptr<DeviceTensor>> dev;
};

TEST_F(CudaBackend, AutoResolvesToCudaForDevicePointers) {
  flashqla_gdn_fwd_params_t p = device_params();
  flashqla_backend_t backend = FLASHQLA_BACKEND_AUTO;
  ASSERT_EQ(flashqla_gdn_resolve_backend(&p, &backend), FLASHQLA_STATUS_SUCCESS)
      << flashqla_last_error_message();
  EXPECT_EQ(backend, FLASHQLA_BACKEND_CUDA);
}

TEST_F(CudaBackend, KernelNameForOtherHeadSizesIsSimple) {
  flashqla_gdn_fwd_params_t p = device_params();  // K = V = 16
  const char* name = nullptr;
  ASSERT_EQ(flashqla_gdn_fwd_kernel_name(&p, &name), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_STREQ(name, "sm90_simple");
}

// The choice of a call the fused kernel does not cover: the simple kernel, no
// pieces, and the rule it breaks; the same params with the simple kernel forced
// say so instead.
TEST_F(CudaBackend, KernelChoiceSaysWhyNotTheFusedKernel) {
  flashqla_gdn_fwd_params_t p = device_params();  // K = V = 16
  flashqla_gdn_fwd_kernel_choice_t choice{};
  ASSERT_EQ(flashqla_gdn_fwd_kernel_choice(&p, &choice), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_EQ(choice.backend, FLASHQLA_BACKEND_CUDA);
  EXPECT_EQ(choice.kernel, FLASHQLA_FWD_KERNEL_SM90_SIMPLE);
  EXPECT_STREQ(choice.kernel_name, "sm90_simple");
  EXPECT_EQ(choice.pieces, FLASHQLA_FWD_PIECES_NONE);
  EXPECT_EQ(choice.lengths_guessed, 0);
  EXPECT_EQ(choice.workspace_bytes, 0u);
  const char* forced = std::getenv("FLASHQLA_FORWARD_KERNEL");
  if (forced != nullptr && std::string(forced) == "simple") {
    EXPECT_THAT(choice.reason, HasSubstr("FLASHQLA_FORWARD_KERNEL=simple"));
  } else {
    EXPECT_STREQ(choice.reason, "K = 16, V = 16: the fused kernel needs K = V = 128");
  }
  p.k.dtype = FLASHQLA_DTYPE_FLOAT16;  // what the forward refuses, the choice refuses
  EXPECT_EQ(flashqla_gdn_fwd_kernel_choice(&p, &choice), FLASHQLA_STATUS_NOT_SUPPORTED);
  EXPECT_THAT(flashqla_last_error_message(), HasSubstr("q, k and v must share one dtype"));
}

TEST_F(CudaBackend, MixedHostAndDevicePointersAreRejected) {
  flashqla_gdn_fwd_params_t p = device_params();
  p.k = c.k.desc;  // host memory
  EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(flashqla_last_error_message(), HasSubstr("k: points to host memory"));
}

TEST_F(CudaBackend, DevicePointersOnCpuBackendAreRejected) {
  flashqla_gdn_fwd_params_t p = device_params();
  p.backend = FLASHQLA_BACKEND_CPU;
  EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(flashqla_last_error_message(), HasSubstr("q: points to CUDA device memory"));
}

TEST_F(CudaBackend, DebugCheckFindsBadCuSeqlens) {
  void* workspace = nullptr;
  ASSERT_EQ(cudaMalloc(&workspace, 1 << 20), cudaSuccess);
  struct Bad {
    std::vector<int32_t> cu;
    const char* phrase;
  };
  const Bad cases[] = {{{1, 5, 5, 70}, "must start at 0"},
                       {{0, 6, 5, 70}, "must be non-decreasing"},
                       {{0, 5, 5, 69}, "must end at T = 70"}};
  for (const Bad& bad : cases) {
    set_cu_seqlens(bad.cu);
    flashqla_gdn_fwd_params_t p = device_params();
    p.debug_check_cu_seqlens = 1;
    size_t bytes = 0;
    ASSERT_EQ(flashqla_gdn_fwd_workspace_size(&p, &bytes), FLASHQLA_STATUS_SUCCESS)
        << flashqla_last_error_message();
    ASSERT_GT(bytes, 0u);
    p.workspace_bytes = bytes - 1;
    p.workspace = workspace;
    EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_WORKSPACE_TOO_SMALL);
    p.workspace_bytes = bytes;
    EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_INVALID_CU_SEQLENS) << bad.phrase;
    EXPECT_THAT(flashqla_last_error_message(), HasSubstr(bad.phrase));
    EXPECT_THAT(flashqla_last_error_message(), HasSubstr("cu_seqlens (checked on the device)"));
  }
  // Valid contents pass the check and reach the kernel dispatch.
  set_cu_seqlens({0, 5, 5, 70});
  flashqla_gdn_fwd_params_t p = device_params();
  p.debug_check_cu_seqlens = 1;
  p.workspace = workspace;
  p.workspace_bytes = 1 << 20;
  const flashqla_status_t st = flashqla_gdn_fwd(&p);
  EXPECT_NE(st, FLASHQLA_STATUS_INVALID_CU_SEQLENS) << flashqla_last_error_message();
  cudaFree(workspace);
}

TEST_F(CudaBackend, HostCopyOfCuSeqlensIsCheckedWithoutDeviceRead) {
  flashqla_gdn_fwd_params_t p = device_params();
  const std::vector<int32_t> wrong = {0, 5, 4, 70};
  p.cu_seqlens_host = wrong.data();
  EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(flashqla_last_error_message(), HasSubstr("cu_seqlens_host: must be non-decreasing"));
}

TEST_F(CudaBackend, Float64IsCpuOnly) {
  flashqla_gdn_fwd_params_t p = device_params();
  p.o.dtype = FLASHQLA_DTYPE_FLOAT64;
  EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_NOT_SUPPORTED);
  EXPECT_THAT(flashqla_last_error_message(), HasSubstr("o: float64 is supported on the CPU backend only"));
}

// --- forward on the GPU against the CPU backend (fp64 on the same inputs) -----

struct GpuFwdConfig {
  std::string name;
  int64_t B = 1, T = 0, H = 1, HV = 2, K = 128, V = 128;
  std::vector<int64_t> cu_seqlens;
  flashqla_dtype_t dtype = FLASHQLA_DTYPE_BFLOAT16;
  bool h0 = true, v_first = false, l2norm = false;
  double g_value = NAN, beta_value = NAN;
  int64_t row_pad = 0, o_row_pad = 0;
  // Whether the fused kernel covers the shape (else the simple kernel runs).
  bool fused = true;
  // The piece plan forced for this case (FLASHQLA_SEQUENCE_PARALLEL,
  // FLASHQLA_PIECE_CHUNKS); empty: the default plan.
  std::string sequence_parallel, piece_chunks;
};

// Sets (or, with an empty value, leaves unset) an environment variable for a
// scope, restoring the previous state after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (!value.empty()) setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// The kernel a GpuForward case must run: the fused one where it covers the
// shape, unless the suite runs with FLASHQLA_FORWARD_KERNEL=simple (a second
// ctest entry does, so both kernels meet the oracle on the fast-path shapes).
std::string expected_kernel(const GpuFwdConfig& f) {
  const char* forced = std::getenv("FLASHQLA_FORWARD_KERNEL");
  const bool simple_forced = forced != nullptr && std::string(forced) == "simple";
  return f.fused && !simple_forced ? "sm90_fused" : "sm90_simple";
}

// A GPU suite's case from its config's common fields (fp32 gates and states).
template <typename Config>
GdnCase gpu_case(const Config& f) {
  GdnCase c;
  c.B = f.B;
  c.T = f.T;
  c.H = f.H;
  c.HV = f.HV;
  c.K = f.K;
  c.V = f.V;
  c.cu_seqlens = f.cu_seqlens;
  c.dtype = f.dtype;
  c.gate_dtype = FLASHQLA_DTYPE_FLOAT32;
  c.state_dtype = FLASHQLA_DTYPE_FLOAT32;
  c.with_h0 = f.h0;
  c.state_v_first = f.v_first;
  c.l2norm = f.l2norm;
  c.row_pad = f.row_pad;
  return c;
}

class GpuForward : public ::testing::TestWithParam<GpuFwdConfig> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_P(GpuForward, MatchesCpuOracle) {
  const GpuFwdConfig& f = GetParam();
  GdnCase c = gpu_case(f);
  c.o_row_pad = f.o_row_pad;
  c.allocate_and_fill(0xc0ffee + f.T, f.g_value, f.beta_value, 16.0);

  // Oracle: the CPU backend on the same (rounded) inputs, fp64 outputs.
  GdnCase ref = c;
  ref.o = HostTensor(c.o.shape, FLASHQLA_DTYPE_FLOAT64);
  ref.ht = HostTensor(c.ht.shape, FLASHQLA_DTYPE_FLOAT64);
  flashqla_gdn_fwd_params_t rp = ref.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  ASSERT_EQ(flashqla_gdn_fwd(&rp), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();

  DeviceForwardCall call(c);
  const std::vector<std::unique_ptr<DeviceTensor>>& dev = call.dev;
  flashqla_gdn_fwd_params_t& p = call.p;
  const ScopedEnv sequence_parallel("FLASHQLA_SEQUENCE_PARALLEL", f.sequence_parallel);
  const ScopedEnv piece_chunks("FLASHQLA_PIECE_CHUNKS", f.piece_chunks);

  // Workspace as the size query reports it (sequence pieces need one).
  size_t ws_bytes = 0;
  ASSERT_EQ(flashqla_gdn_fwd_workspace_size(&p, &ws_bytes), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  const DeviceWorkspace workspace(ws_bytes);
  p.workspace = workspace.ptr;
  p.workspace_bytes = workspace.bytes;

  const char* kernel = nullptr;
  ASSERT_EQ(flashqla_gdn_fwd_kernel_name(&p, &kernel), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_EQ(std::string(kernel), expected_kernel(f)) << f.name;
  // The kernel choice tells the same plan: its kernel, the workspace the query
  // reported, pieces exactly where that workspace holds them, a reason off the
  // fused kernel only.
  flashqla_gdn_fwd_kernel_choice_t choice{};
  ASSERT_EQ(flashqla_gdn_fwd_kernel_choice(&p, &choice), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_EQ(choice.backend, FLASHQLA_BACKEND_CUDA);
  EXPECT_STREQ(choice.kernel_name, kernel) << f.name;
  EXPECT_EQ(choice.workspace_bytes, ws_bytes) << f.name;
  EXPECT_EQ(choice.reason[0] == '\0', choice.kernel == FLASHQLA_FWD_KERNEL_SM90_FUSED) << f.name << ": " << choice.reason;
  EXPECT_EQ(choice.pieces != FLASHQLA_FWD_PIECES_NONE, choice.piece_chunks > 0) << f.name;
  if (choice.pieces != FLASHQLA_FWD_PIECES_NONE) {
    EXPECT_GT(choice.workspace_bytes, 0u) << f.name;
  }
  if (!f.piece_chunks.empty() && choice.pieces != FLASHQLA_FWD_PIECES_NONE) {
    EXPECT_EQ(choice.piece_chunks, std::stoll(f.piece_chunks)) << f.name;
  }

  std::vector<unsigned char> first_o, first_ht;
  for (int run = 0; run < 2; ++run) {
    poison(*dev[6], c.o.bytes.size());
    poison(*dev[7], c.ht.bytes.size());
    ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<unsigned char> o_bytes = download(*dev[6], c.o.bytes.size());
    std::vector<unsigned char> ht_bytes = download(*dev[7], c.ht.bytes.size());
    if (run == 0) {
      HostTensor o = c.o, ht = c.ht;
      o.bytes = o_bytes;
      ht.bytes = ht_bytes;
      o.desc.data = o.bytes.empty() ? nullptr : o.bytes.data();
      ht.desc.data = ht.bytes.data();
      EXPECT_LE(rel_error(o.to_vector(), ref.o.to_vector()), 0.005) << f.name << " o";
      EXPECT_LE(rel_error(ht.to_vector(), ref.ht.to_vector()), 0.005) << f.name << " final state";
      first_o = o_bytes;
      first_ht = ht_bytes;
    } else {
      EXPECT_EQ(first_o, o_bytes) << f.name << ": o differs between identical runs";
      EXPECT_EQ(first_ht, ht_bytes) << f.name << ": final state differs between identical runs";
    }
  }
}

std::vector<GpuFwdConfig> gpu_forward_configs() {
  std::vector<GpuFwdConfig> v;
  for (int64_t T : {1, 63, 64, 65, 127, 1000, 8192}) {
    GpuFwdConfig f;
    f.name = "len" + std::to_string(T);
    f.T = T;
    v.push_back(f);
  }
  {
    GpuFwdConfig f;
    f.name = "varlen_with_empty";
    f.cu_seqlens = {0, 0, 1, 64, 64, 129, 1000, 1000, 1200};
    f.H = 2;
    f.HV = 4;
    v.push_back(f);
  }
  for (int64_t ratio : {1, 2, 3, 4, 8, 16}) {
    GpuFwdConfig f;
    f.name = "gqa" + std::to_string(ratio);
    f.T = 200;
    f.H = 1;
    f.HV = ratio;
    v.push_back(f);
  }
  GpuFwdConfig f;
  f.T = 300;
  append_gate_and_beta_edge_cases(v, f);
  f.name = "no_h0";
  f.h0 = false;
  v.push_back(f);
  f.h0 = true;
  f.name = "state_v_first";
  f.v_first = true;
  v.push_back(f);
  f.v_first = false;
  f.name = "fp16";
  f.dtype = FLASHQLA_DTYPE_FLOAT16;
  v.push_back(f);
  f.name = "fp32";
  f.dtype = FLASHQLA_DTYPE_FLOAT32;
  f.fused = false;
  v.push_back(f);
  f.fused = true;
  f.dtype = FLASHQLA_DTYPE_BFLOAT16;
  f.name = "strided_views";
  f.row_pad = 24;
  v.push_back(f);
  f.name = "strided_views_unaligned";  // rows not 16-byte aligned: the simple kernel
  f.row_pad = 3;
  f.fused = false;
  v.push_back(f);
  f.fused = true;
  f.row_pad = 0;
  // o a strided view: rows 16-byte aligned (the fused kernel's tensor stores,
  // through a map with o's strides), then only 4-byte aligned (its row stores);
  // the last chunk partial (300 tokens: by rows either way).
  f.name = "o_strided_aligned";
  f.o_row_pad = 8;
  v.push_back(f);
  f.name = "o_strided_unaligned";
  f.o_row_pad = 2;
  v.push_back(f);
  f.o_row_pad = 0;
  f.name = "l2norm_in_kernel";
  f.l2norm = true;
  v.push_back(f);
  f.l2norm = false;
  f.fused = false;  // other head sizes: the simple kernel
  f.name = "K64_V64";
  f.K = f.V = 64;
  v.push_back(f);
  f.name = "K100_V200";
  f.K = 100;
  f.V = 200;
  v.push_back(f);
  f.name = "K256_V256";
  f.K = f.V = 256;
  v.push_back(f);
  // Many sequences (serving batches), far more work items than SMs: lengths
  // 0 .. max_len from a fixed generator (empty sequences, partial and whole
  // chunks). Up to 512 sequences the fused kernel ranks them longest first on
  // the device; beyond, it takes them in order.
  auto many_sequences = [](int64_t n, int64_t max_len) {
    std::vector<int64_t> cu{0};
    uint32_t state = 12345u;
    for (int64_t i = 0; i < n; ++i) {
      state = state * 1664525u + 1013904223u;
      cu.push_back(cu.back() + int64_t((state >> 8) % uint32_t(max_len + 1)));
    }
    return cu;
  };
  {
    GpuFwdConfig m;
    m.name = "many_sequences_ranked";
    m.cu_seqlens = many_sequences(300, 160);
    m.H = 2;
    m.HV = 4;
    v.push_back(m);
    m.name = "many_sequences_in_order";
    m.cu_seqlens = many_sequences(600, 96);
    m.H = 1;
    m.HV = 2;
    v.push_back(m);
  }
  // Sequence pieces, forced: the two piece passes, and chained pieces (one
  // launch, each piece from its predecessor's end state) with several rounds.
  for (const char* mode : {"1", "2"}) {
    GpuFwdConfig p;
    p.name = std::string(mode[0] == '1' ? "piece_passes" : "chained_pieces") + "_len1000";
    p.B = 2;
    p.T = 1000;
    p.HV = 4;
    p.sequence_parallel = mode;
    p.piece_chunks = "2";
    v.push_back(p);
    p.name = std::string(mode[0] == '1' ? "piece_passes" : "chained_pieces") + "_varlen_with_empty";
    p.B = 1;
    p.T = 0;
    p.cu_seqlens = {0, 0, 1, 64, 64, 129, 1000, 1000, 1200};
    p.v_first = true;
    v.push_back(p);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, GpuForward, ::testing::ValuesIn(gpu_forward_configs()),
                         [](const auto& info) { return info.param.name; });

// --- backward on the GPU against the CPU backend (fp64 on the same inputs) ----

struct GpuBwdConfig {
  std::string name;
  int64_t B = 1, T = 0, H = 1, HV = 2, K = 128, V = 128;
  std::vector<int64_t> cu_seqlens;
  flashqla_dtype_t dtype = FLASHQLA_DTYPE_BFLOAT16;
  bool h0 = true, dht = true, v_first = false, l2norm = false;
  flashqla_beta_activation_t beta_act = FLASHQLA_BETA_IDENTITY;
  double g_value = NAN, beta_value = NAN;
  int64_t row_pad = 0;
  std::string chain_columns;  // FLASHQLA_BACKWARD_CHAIN_COLUMNS ("": the plan's choice)
  std::string piece_chunks;   // FLASHQLA_BACKWARD_PIECE_CHUNKS ("": the plan's choice)
  bool plan_cuts = false;     // the plan's own choice must be sequence pieces (checked on this GPU)
};

class GpuBackward : public ::testing::TestWithParam<GpuBwdConfig> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

// Every gradient against the CPU backend's chunked backward in fp64 on the same
// (rounded) inputs, with the gradient outputs poisoned with NaN first; a second
// run must give the same bits.
TEST_P(GpuBackward, MatchesCpuOracle) {
  const GpuBwdConfig& f = GetParam();
  GdnCase c = gpu_case(f);
  c.with_dht = f.dht;
  c.beta_act = f.beta_act;
  c.allocate_and_fill(0xbac4 + f.T + f.K, f.g_value, f.beta_value, 16.0);

  GdnCase ref = c;
  for (HostTensor* t : {&ref.dq, &ref.dk, &ref.dv, &ref.dg, &ref.dbeta, &ref.dh0}) {
    if (!t->shape.empty()) *t = HostTensor(t->shape, FLASHQLA_DTYPE_FLOAT64);
  }
  flashqla_gdn_bwd_params_t rp = ref.bwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  ASSERT_EQ(flashqla_gdn_bwd(&rp), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();

  const ScopedEnv chain_columns("FLASHQLA_BACKWARD_CHAIN_COLUMNS", f.chain_columns);
  const ScopedEnv piece_chunks("FLASHQLA_BACKWARD_PIECE_CHUNKS", f.piece_chunks);
  DeviceBackwardCall call(c);
  const std::vector<std::unique_ptr<DeviceTensor>>& dev = call.dev;
  flashqla_gdn_bwd_params_t& p = call.p;

  size_t ws_bytes = 0;
  ASSERT_EQ(flashqla_gdn_bwd_workspace_size(&p, &ws_bytes), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  // The kernel choice tells the same plan: the tensor-core backward exactly
  // where its rules cover the call (bf16, K = V = 128, 16-byte rows), a reason
  // otherwise, the workspace the query reported.
  flashqla_gdn_bwd_kernel_choice_t choice{};
  ASSERT_EQ(flashqla_gdn_bwd_kernel_choice(&p, &choice), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_EQ(choice.backend, FLASHQLA_BACKEND_CUDA);
  EXPECT_EQ(choice.workspace_bytes, ws_bytes) << f.name;
  const char* forced_kernel = std::getenv("FLASHQLA_BACKWARD_KERNEL");
  const bool tc_rules = f.dtype == FLASHQLA_DTYPE_BFLOAT16 && f.K == 128 && f.V == 128 && f.row_pad % 8 == 0 &&
                        !(forced_kernel != nullptr && std::string(forced_kernel) == "simple");
  EXPECT_EQ(choice.kernel, tc_rules ? FLASHQLA_BWD_KERNEL_SM90_TENSOR_CORE : FLASHQLA_BWD_KERNEL_SM90_SIMPLE)
      << f.name << ": " << choice.reason;
  EXPECT_STREQ(choice.kernel_name, tc_rules ? "sm90_tensor_core" : "sm90_simple") << f.name;
  EXPECT_EQ(choice.reason[0] == '\0', tc_rules) << f.name << ": " << choice.reason;
  if (!f.piece_chunks.empty()) {  // forced
    EXPECT_EQ(choice.piece_chunks, tc_rules ? std::stoll(f.piece_chunks) : 0) << f.name;
  }
  if (f.plan_cuts) {  // the case exists to run the plan's own pieces: it must still choose them
    ASSERT_GT(choice.piece_chunks, 0) << f.name << ": the backward's plan no longer cuts this sequence";
  }
  const DeviceWorkspace workspace(ws_bytes);
  p.fwd.workspace = workspace.ptr;
  p.fwd.workspace_bytes = workspace.bytes;

  const struct {
    const char* name;
    size_t index;
    HostTensor* out;
    const HostTensor* expected;
    double tol;
  } grads[] = {{"dq", 9, &c.dq, &ref.dq, 0.008},       {"dk", 10, &c.dk, &ref.dk, 0.008},
               {"dv", 11, &c.dv, &ref.dv, 0.008},       {"dg", 12, &c.dg, &ref.dg, 0.02},
               {"dbeta", 13, &c.dbeta, &ref.dbeta, 0.008}, {"dh0", 14, &c.dh0, &ref.dh0, 0.008}};
  const double fp32_tol = 2e-4;
  std::vector<std::vector<unsigned char>> first(std::size(grads));
  for (int run = 0; run < 2; ++run) {
    for (const auto& gr : grads) poison(*dev[gr.index], gr.out->bytes.size());
    ASSERT_EQ(flashqla_gdn_bwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i = 0; i < std::size(grads); ++i) {
      const auto& gr = grads[i];
      if (gr.name == std::string("dh0") && !f.h0) continue;
      std::vector<unsigned char> bytes = download(*dev[gr.index], gr.out->bytes.size());
      if (run == 0) {
        HostTensor got = *gr.out;
        got.bytes = bytes;
        got.desc.data = got.bytes.empty() ? nullptr : got.bytes.data();
        const double tol = f.dtype == FLASHQLA_DTYPE_FLOAT32 ? fp32_tol : gr.tol;
        const double err = rel_error(got.to_vector(), gr.expected->to_vector());
        EXPECT_LE(err, tol) << f.name << " " << gr.name;
        std::printf("[ backward ] %s %s relative error %.3e\n", f.name.c_str(), gr.name, err);
        first[i] = std::move(bytes);
      } else {
        EXPECT_EQ(first[i], bytes) << f.name << " " << gr.name << " differs between identical runs";
      }
    }
  }
}

std::vector<GpuBwdConfig> gpu_backward_configs() {
  std::vector<GpuBwdConfig> v;
  for (int64_t T : {1, 63, 64, 65, 300}) {
    GpuBwdConfig f;
    f.name = "len" + std::to_string(T);
    f.T = T;
    v.push_back(f);
  }
  {
    GpuBwdConfig f;
    f.name = "batch2_len130";
    f.B = 2;
    f.T = 130;
    v.push_back(f);
    f.name = "varlen_with_empty";
    f.B = 1;
    f.T = 0;
    f.cu_seqlens = {0, 0, 1, 64, 64, 129, 300, 300, 400};
    f.H = 2;
    f.HV = 4;
    v.push_back(f);
  }
  {
    GpuBwdConfig f;
    f.name = "len1000_gqa2";
    f.T = 1000;
    f.H = 2;
    f.HV = 4;
    v.push_back(f);
    f.name = "varlen_many";
    f.T = 0;
    f.cu_seqlens = {0, 3, 67, 67, 200, 263, 264, 400, 528, 600, 700, 701};
    v.push_back(f);
    // The chains at both widths on the same shapes (the plan picks 16 value
    // columns a CTA only where few chains would leave the SMs idle).
    for (const char* cols : {"16", "32"}) {
      f.chain_columns = cols;
      f.name = std::string("varlen_many_chains") + cols;
      v.push_back(f);
      f.name = std::string("len1000_gqa2_chains") + cols;
      f.T = 1000;
      f.cu_seqlens.clear();
      v.push_back(f);
      f.T = 0;
      f.cu_seqlens = {0, 3, 67, 67, 200, 263, 264, 400, 528, 600, 700, 701};
    }
    f.chain_columns.clear();
    // The chains by sequence pieces: two pieces (no middle one), four and
    // eight of a 16-chunk sequence, and pieces of one chunk over packed
    // sequences with empty ones, at both widths.
    f.T = 1000;
    f.cu_seqlens.clear();
    for (const char* pc : {"8", "5", "2"}) {
      f.piece_chunks = pc;
      f.name = std::string("len1000_gqa2_pieces") + pc;
      v.push_back(f);
    }
    // No end gradient (the last piece's gradient chain from zero), V-first states
    // (h0 read and d_initial_state written by the first piece).
    f.piece_chunks = "5";
    f.dht = false;
    f.v_first = true;
    f.name = "len1000_gqa2_pieces5_no_dht_v_first";
    v.push_back(f);
    f.dht = true;
    f.v_first = false;
    f.T = 0;
    f.cu_seqlens = {0, 3, 67, 67, 200, 263, 264, 400, 528, 600, 700, 701};
    f.piece_chunks = "1";
    for (const char* cols : {"16", "32"}) {
      f.chain_columns = cols;
      f.name = std::string("varlen_many_pieces1_chains") + cols;
      v.push_back(f);
    }
    f.chain_columns.clear();
    f.piece_chunks.clear();
    // The plan's own pieces (backward_piece_model.h): one sequence of one or two
    // value heads long enough for the model to cut it (at 16 and at 32 columns).
    f.cu_seqlens.clear();
    f.plan_cuts = true;
    f.H = 1;
    f.HV = 2;
    f.T = 4096;
    f.name = "len4096_plan_pieces";
    v.push_back(f);
    f.HV = 1;
    f.T = 8192;
    f.name = "len8192_hv1_plan_pieces";
    v.push_back(f);
  }
  for (int64_t ratio : {1, 3, 16}) {
    GpuBwdConfig f;
    f.name = "gqa" + std::to_string(ratio);
    f.T = 100;
    f.HV = ratio;
    v.push_back(f);
  }
  GpuBwdConfig f;
  f.T = 200;
  append_gate_and_beta_edge_cases(v, f);
  f.name = "no_h0_no_dht";
  f.h0 = false;
  f.dht = false;
  v.push_back(f);
  f.h0 = f.dht = true;
  f.name = "state_v_first";
  f.v_first = true;
  v.push_back(f);
  f.v_first = false;
  f.name = "l2norm_in_kernel";
  f.l2norm = true;
  v.push_back(f);
  f.l2norm = false;
  f.name = "beta_sigmoid";
  f.beta_act = FLASHQLA_BETA_SIGMOID;
  v.push_back(f);
  f.name = "beta_sigmoid_x2";
  f.beta_act = FLASHQLA_BETA_SIGMOID_X2;
  v.push_back(f);
  f.beta_act = FLASHQLA_BETA_IDENTITY;
  f.name = "fp16";
  f.dtype = FLASHQLA_DTYPE_FLOAT16;
  v.push_back(f);
  f.name = "fp32";
  f.dtype = FLASHQLA_DTYPE_FLOAT32;
  v.push_back(f);
  f.dtype = FLASHQLA_DTYPE_BFLOAT16;
  f.name = "strided_views";
  f.row_pad = 3;
  v.push_back(f);
  f.name = "strided_views_aligned";  // rows 16-byte aligned: the tensor-core backward
  f.row_pad = 8;
  v.push_back(f);
  f.row_pad = 0;
  f.name = "K64_V64";
  f.K = f.V = 64;
  v.push_back(f);
  f.name = "K100_V200";
  f.K = 100;
  f.V = 200;
  v.push_back(f);
  f.name = "K256_V256";
  f.T = 130;
  f.K = f.V = 256;
  v.push_back(f);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, GpuBackward, ::testing::ValuesIn(gpu_backward_configs()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace flashqla_test
