// The small parts of the C API: version, status names, params defaults,
// backend resolution and the thread-local last-error message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "flashqla/flashqla.h"
#include "test_support.h"

namespace flashqla_test {
namespace {

using ::testing::HasSubstr;

const std::vector<std::pair<flashqla_status_t, std::string>>& all_statuses() {
  static const std::vector<std::pair<flashqla_status_t, std::string>> statuses = {
      {FLASHQLA_STATUS_SUCCESS, "FLASHQLA_STATUS_SUCCESS"},
      {FLASHQLA_STATUS_INVALID_ARGUMENT, "FLASHQLA_STATUS_INVALID_ARGUMENT"},
      {FLASHQLA_STATUS_NOT_SUPPORTED, "FLASHQLA_STATUS_NOT_SUPPORTED"},
      {FLASHQLA_STATUS_WORKSPACE_TOO_SMALL, "FLASHQLA_STATUS_WORKSPACE_TOO_SMALL"},
      {FLASHQLA_STATUS_CUDA_ERROR, "FLASHQLA_STATUS_CUDA_ERROR"},
      {FLASHQLA_STATUS_OUT_OF_MEMORY, "FLASHQLA_STATUS_OUT_OF_MEMORY"},
      {FLASHQLA_STATUS_INVALID_CU_SEQLENS, "FLASHQLA_STATUS_INVALID_CU_SEQLENS"},
      {FLASHQLA_STATUS_INTERNAL_ERROR, "FLASHQLA_STATUS_INTERNAL_ERROR"},
  };
  return statuses;
}

// A small valid fp32 CPU problem.
GdnCase small_case() {
  GdnCase c;
  c.B = 1;
  c.T = 4;
  c.H = 1;
  c.HV = 2;
  c.K = 4;
  c.V = 4;
  c.dtype = FLASHQLA_DTYPE_FLOAT32;
  c.gate_dtype = FLASHQLA_DTYPE_FLOAT32;
  c.state_dtype = FLASHQLA_DTYPE_FLOAT32;
  c.allocate_and_fill(11);
  return c;
}

bool tensor_is_unset(const flashqla_tensor_t& t) {
  return t.data == nullptr && t.dtype == FLASHQLA_DTYPE_FLOAT32 && t.stride[0] == 0 &&
         t.stride[1] == 0 && t.stride[2] == 0 && t.stride[3] == 0;
}

void expect_fwd_defaults(const flashqla_gdn_fwd_params_t& p) {
  EXPECT_EQ(p.B, 0);
  EXPECT_EQ(p.T, 0);
  EXPECT_EQ(p.H, 0);
  EXPECT_EQ(p.HV, 0);
  EXPECT_EQ(p.K, 0);
  EXPECT_EQ(p.V, 0);
  EXPECT_EQ(p.N, 0);
  for (const flashqla_tensor_t* t : {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.initial_state,
                                     &p.cu_seqlens, &p.o, &p.final_state}) {
    EXPECT_TRUE(tensor_is_unset(*t));
  }
  EXPECT_EQ(p.initial_state_n, 0);
  EXPECT_EQ(p.cu_seqlens_host, nullptr);
  EXPECT_TRUE(std::isnan(p.scale));
  EXPECT_EQ(p.output_final_state, 0);
  EXPECT_EQ(p.state_v_first, 0);
  EXPECT_EQ(p.use_qk_l2norm, 0);
  EXPECT_EQ(p.beta_activation, FLASHQLA_BETA_IDENTITY);
  EXPECT_EQ(p.backend, FLASHQLA_BACKEND_AUTO);
  EXPECT_EQ(p.stream, nullptr);
  EXPECT_EQ(p.workspace, nullptr);
  EXPECT_EQ(p.workspace_bytes, 0u);
  EXPECT_EQ(p.debug_check_cu_seqlens, 0);
  EXPECT_EQ(p.cpu_algorithm, FLASHQLA_CPU_ALGORITHM_CHUNKED);
  EXPECT_EQ(p.cpu_num_threads, 0);
}

TEST(Api, VersionMatchesHeader) {
  EXPECT_EQ(flashqla_version(), FLASHQLA_VERSION);
  EXPECT_EQ(FLASHQLA_VERSION, 100);
  const std::string expected = std::to_string(FLASHQLA_VERSION_MAJOR) + "." +
                               std::to_string(FLASHQLA_VERSION_MINOR) + "." +
                               std::to_string(FLASHQLA_VERSION_PATCH);
  ASSERT_NE(flashqla_version_string(), nullptr);
  EXPECT_EQ(std::string(flashqla_version_string()), expected);
  EXPECT_STREQ(flashqla_version_string(), "0.1.0");
}

TEST(Api, StatusStringsNameEveryStatus) {
  std::set<std::string> seen;
  for (const auto& [status, name] : all_statuses()) {
    const char* s = flashqla_status_string(status);
    ASSERT_NE(s, nullptr) << name;
    EXPECT_THAT(s, HasSubstr(name));
    EXPECT_TRUE(seen.insert(s).second) << "duplicate status string " << s;
  }
}

TEST(Api, StatusStringOfUnknownValue) {
  for (int value : {-1, 8, 1000}) {
    const char* s = flashqla_status_string(static_cast<flashqla_status_t>(value));
    ASSERT_NE(s, nullptr) << value;
    EXPECT_STRNE(s, "");
    for (const auto& [status, name] : all_statuses()) EXPECT_STRNE(s, name.c_str());
  }
}

TEST(Api, FwdParamsInitDefaults) {
  flashqla_gdn_fwd_params_t p;
  std::memset(&p, 0xab, sizeof(p));
  flashqla_gdn_fwd_params_init(&p);
  expect_fwd_defaults(p);
}

TEST(Api, BwdParamsInitDefaults) {
  flashqla_gdn_bwd_params_t p;
  std::memset(&p, 0xab, sizeof(p));
  flashqla_gdn_bwd_params_init(&p);
  expect_fwd_defaults(p.fwd);
  for (const flashqla_tensor_t* t :
       {&p.d_o, &p.d_final_state, &p.dq, &p.dk, &p.dv, &p.dg, &p.dbeta, &p.d_initial_state}) {
    EXPECT_TRUE(tensor_is_unset(*t));
  }
}

TEST(Api, ParamsInitAcceptsNull) {
  flashqla_gdn_fwd_params_init(nullptr);
  flashqla_gdn_bwd_params_init(nullptr);
}

TEST(Api, AutoBackendResolvesToCpuForHostPointers) {
  GdnCase c = small_case();
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  for (flashqla_backend_t requested : {FLASHQLA_BACKEND_AUTO, FLASHQLA_BACKEND_CPU}) {
    p.backend = requested;
    flashqla_backend_t resolved = FLASHQLA_BACKEND_CUDA;
    ASSERT_EQ(flashqla_gdn_resolve_backend(&p, &resolved), FLASHQLA_STATUS_SUCCESS)
        << flashqla_last_error_message();
    EXPECT_EQ(resolved, FLASHQLA_BACKEND_CPU);
    EXPECT_STREQ(flashqla_last_error_message(), "");
  }
}

TEST(Api, KernelNameNamesTheCpuAlgorithm) {
  GdnCase c = small_case();
  const char* name = nullptr;
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  ASSERT_EQ(flashqla_gdn_fwd_kernel_name(&p, &name), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_STREQ(name, "cpu_chunked");
  p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_RECURRENT);
  ASSERT_EQ(flashqla_gdn_fwd_kernel_name(&p, &name), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_STREQ(name, "cpu_recurrent");
  EXPECT_EQ(flashqla_gdn_fwd_kernel_name(&p, nullptr), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(flashqla_last_error_message(), HasSubstr("flashqla_gdn_fwd_kernel_name: name"));
  p.q.data = nullptr;  // invalid params are reported, not named
  EXPECT_EQ(flashqla_gdn_fwd_kernel_name(&p, &name), FLASHQLA_STATUS_INVALID_ARGUMENT);
}

// The kernel choice on the CPU backend: the algorithm asked for, no pieces, no
// workspace, and why the fused kernel does not run the call.
TEST(Api, KernelChoiceOnTheCpu) {
  GdnCase c = small_case();
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  p.backend = FLASHQLA_BACKEND_AUTO;
  flashqla_gdn_fwd_kernel_choice_t choice;
  std::memset(&choice, 0x5a, sizeof(choice));  // every field is written
  ASSERT_EQ(flashqla_gdn_fwd_kernel_choice(&p, &choice), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_EQ(choice.backend, FLASHQLA_BACKEND_CPU);
  EXPECT_EQ(choice.kernel, FLASHQLA_FWD_KERNEL_CPU_CHUNKED);
  EXPECT_STREQ(choice.kernel_name, "cpu_chunked");
  EXPECT_EQ(choice.pieces, FLASHQLA_FWD_PIECES_NONE);
  EXPECT_EQ(choice.piece_chunks, 0);
  EXPECT_EQ(choice.lengths_guessed, 0);
  EXPECT_EQ(choice.workspace_bytes, 0u);
  EXPECT_STREQ(choice.reason, "the CPU backend computes the call (the fused kernel runs CUDA calls only)");
  EXPECT_STREQ(flashqla_last_error_message(), "");

  p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_RECURRENT);
  p.backend = FLASHQLA_BACKEND_CPU;
  ASSERT_EQ(flashqla_gdn_fwd_kernel_choice(&p, &choice), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_EQ(choice.kernel, FLASHQLA_FWD_KERNEL_CPU_RECURRENT);
  EXPECT_STREQ(choice.kernel_name, "cpu_recurrent");
  EXPECT_STREQ(choice.reason, "the CPU backend computes the call (the fused kernel runs CUDA calls only)");
}

// The backward's kernel choice on the CPU backend: the algorithm asked for, no
// workspace, why not the tensor-core backward; it validates as the backward does.
TEST(Api, BackwardKernelChoiceOnTheCpu) {
  GdnCase c = small_case();
  for (auto algorithm : {FLASHQLA_CPU_ALGORITHM_CHUNKED, FLASHQLA_CPU_ALGORITHM_RECURRENT}) {
    flashqla_gdn_bwd_params_t p = c.bwd_params(algorithm);
    p.fwd.backend = FLASHQLA_BACKEND_AUTO;
    flashqla_gdn_bwd_kernel_choice_t choice;
    std::memset(&choice, 0x5a, sizeof(choice));  // every field is written
    ASSERT_EQ(flashqla_gdn_bwd_kernel_choice(&p, &choice), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
    const bool recurrent = algorithm == FLASHQLA_CPU_ALGORITHM_RECURRENT;
    EXPECT_EQ(choice.backend, FLASHQLA_BACKEND_CPU);
    EXPECT_EQ(choice.kernel, recurrent ? FLASHQLA_BWD_KERNEL_CPU_RECURRENT : FLASHQLA_BWD_KERNEL_CPU_CHUNKED);
    EXPECT_STREQ(choice.kernel_name, recurrent ? "cpu_recurrent" : "cpu_chunked");
    size_t bytes = 1;
    ASSERT_EQ(flashqla_gdn_bwd_workspace_size(&p, &bytes), FLASHQLA_STATUS_SUCCESS);
    EXPECT_EQ(choice.workspace_bytes, bytes);
    EXPECT_EQ(choice.workspace_bytes, 0u);
    EXPECT_EQ(choice.piece_chunks, 0);
    EXPECT_STREQ(choice.reason, "the CPU backend computes the call (the tensor-core backward runs CUDA calls only)");
  }
  flashqla_gdn_bwd_params_t p = c.bwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  flashqla_gdn_bwd_kernel_choice_t choice{};
  EXPECT_EQ(flashqla_gdn_bwd_kernel_choice(&p, nullptr), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(flashqla_last_error_message(), HasSubstr("flashqla_gdn_bwd_kernel_choice: choice: pointer is NULL"));
  // What the backward rejects, the choice rejects with the same status and message.
  p.d_o.data = nullptr;
  EXPECT_EQ(flashqla_gdn_bwd(&p), FLASHQLA_STATUS_INVALID_ARGUMENT);
  const std::string message = flashqla_last_error_message();
  ASSERT_NE(message.find("flashqla_gdn_bwd: "), std::string::npos) << message;
  EXPECT_EQ(flashqla_gdn_bwd_kernel_choice(&p, &choice), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(flashqla_last_error_message()),
            "flashqla_gdn_bwd_kernel_choice: " + message.substr(std::string("flashqla_gdn_bwd: ").size()));
}

// The choice agrees with the kernel name and the workspace query on the same params.
TEST(Api, KernelChoiceAgreesWithKernelNameAndWorkspace) {
  GdnCase c = small_case();
  for (auto algorithm : {FLASHQLA_CPU_ALGORITHM_CHUNKED, FLASHQLA_CPU_ALGORITHM_RECURRENT}) {
    flashqla_gdn_fwd_params_t p = c.fwd_params(algorithm);
    flashqla_gdn_fwd_kernel_choice_t choice{};
    const char* name = nullptr;
    size_t bytes = 1;
    ASSERT_EQ(flashqla_gdn_fwd_kernel_choice(&p, &choice), FLASHQLA_STATUS_SUCCESS);
    ASSERT_EQ(flashqla_gdn_fwd_kernel_name(&p, &name), FLASHQLA_STATUS_SUCCESS);
    ASSERT_EQ(flashqla_gdn_fwd_workspace_size(&p, &bytes), FLASHQLA_STATUS_SUCCESS);
    EXPECT_EQ(choice.kernel_name, name);  // the same static string
    EXPECT_EQ(choice.workspace_bytes, bytes);
  }
}

// The choice validates as the forward does: what the forward rejects, it rejects
// with the same status and message (under its own name).
TEST(Api, KernelChoiceValidatesLikeTheForward) {
  GdnCase c = small_case();
  flashqla_gdn_fwd_kernel_choice_t choice{};
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  EXPECT_EQ(flashqla_gdn_fwd_kernel_choice(&p, nullptr), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(flashqla_last_error_message(), HasSubstr("flashqla_gdn_fwd_kernel_choice: choice: pointer is NULL"));
  EXPECT_EQ(flashqla_gdn_fwd_kernel_choice(nullptr, &choice), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_THAT(flashqla_last_error_message(), HasSubstr("flashqla_gdn_fwd_kernel_choice: params"));

  struct Break {
    const char* what;
    void (*apply)(flashqla_gdn_fwd_params_t&);
  };
  const Break breaks[] = {
      {"o: pointer is NULL", [](flashqla_gdn_fwd_params_t& q) { q.o.data = nullptr; }},
      {"K: key head dim", [](flashqla_gdn_fwd_params_t& q) { q.K = 300; }},
      {"q.stride[3]", [](flashqla_gdn_fwd_params_t& q) { q.q.stride[3] = 2; }},
      {"HV:", [](flashqla_gdn_fwd_params_t& q) { q.H = 3; }},
  };
  for (const Break& b : breaks) {
    flashqla_gdn_fwd_params_t bad = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
    b.apply(bad);
    const flashqla_status_t fwd = flashqla_gdn_fwd(&bad);
    const std::string fwd_message = flashqla_last_error_message();
    ASSERT_NE(fwd, FLASHQLA_STATUS_SUCCESS) << b.what;
    EXPECT_EQ(flashqla_gdn_fwd_kernel_choice(&bad, &choice), fwd) << b.what;
    const std::string message = flashqla_last_error_message();
    EXPECT_THAT(message, HasSubstr(b.what));
    EXPECT_EQ(message.substr(message.find(": ")), fwd_message.substr(fwd_message.find(": "))) << b.what;
  }
  // The workspace is the caller's to size after asking: the choice does not check it.
  p.workspace = nullptr;
  p.workspace_bytes = 0;
  EXPECT_EQ(flashqla_gdn_fwd_kernel_choice(&p, &choice), FLASHQLA_STATUS_SUCCESS);
}

TEST(Api, AutoBackendComputesOnTheCpu) {
  GdnCase c = small_case();
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  p.backend = FLASHQLA_BACKEND_AUTO;
  ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_FALSE(any_nan(c.o.to_vector()));
}

TEST(Api, LastErrorIsEmptyAfterSuccess) {
  GdnCase c = small_case();
  ASSERT_NE(flashqla_gdn_fwd(nullptr), FLASHQLA_STATUS_SUCCESS);
  EXPECT_STRNE(flashqla_last_error_message(), "");

  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  ASSERT_NE(flashqla_last_error_message(), nullptr);
  EXPECT_STREQ(flashqla_last_error_message(), "");

  ASSERT_NE(flashqla_gdn_bwd(nullptr), FLASHQLA_STATUS_SUCCESS);
  flashqla_gdn_bwd_params_t b = c.bwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  ASSERT_EQ(flashqla_gdn_bwd(&b), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_STREQ(flashqla_last_error_message(), "");
}

TEST(Api, LastErrorIsThreadLocal) {
  // This thread fails first; a fresh thread must not see that message.
  ASSERT_EQ(flashqla_gdn_fwd(nullptr), FLASHQLA_STATUS_INVALID_ARGUMENT);
  const std::string main_message = flashqla_last_error_message();
  EXPECT_THAT(main_message, HasSubstr("flashqla_gdn_fwd"));

  std::string fresh_message = "not read";
  std::string own_message;
  std::thread other([&] {
    fresh_message = flashqla_last_error_message();
    flashqla_backend_t backend;
    flashqla_gdn_resolve_backend(nullptr, &backend);
    own_message = flashqla_last_error_message();
  });
  other.join();

  EXPECT_EQ(fresh_message, "");
  EXPECT_THAT(own_message, HasSubstr("flashqla_gdn_resolve_backend"));
  // The other thread's failure did not replace this thread's message.
  EXPECT_EQ(std::string(flashqla_last_error_message()), main_message);
}

TEST(Api, LastErrorOfConcurrentThreadsStaysSeparate) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &mismatches] {
      for (int round = 0; round < kRounds; ++round) {
        // Even threads fail the forward, odd threads the backward.
        const bool forward = t % 2 == 0;
        if (forward) {
          flashqla_gdn_fwd(nullptr);
        } else {
          flashqla_gdn_bwd(nullptr);
        }
        const std::string expected = forward ? "flashqla_gdn_fwd: params:" : "flashqla_gdn_bwd: params:";
        if (std::string(flashqla_last_error_message()).rfind(expected, 0) != 0) ++mismatches[t];
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

TEST(Api, HasCudaBackendIsABoolean) {
  const int has = flashqla_has_cuda_backend();
  EXPECT_TRUE(has == 0 || has == 1);
}

}  // namespace
}  // namespace flashqla_test
