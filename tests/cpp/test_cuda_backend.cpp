// The CUDA backend through the C API: backend resolution from device
// pointers, device-only validation, and the device-side cu_seqlens debug
// check. Built only with the CUDA backend; skips (with the reason) where no
// CUDA device exists and runs wherever one does.
#include <cuda_runtime_api.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "test_support.h"

namespace flashqla_test {
namespace {

using ::testing::HasSubstr;

bool have_cuda_device() {
  int count = 0;
  const bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  (void)cudaGetLastError();
  return ok;
}

// A device copy of a host tensor (same strides, same dtype).
struct DeviceTensor {
  void* ptr = nullptr;
  flashqla_tensor_t desc{};
  explicit DeviceTensor(const HostTensor& h) {
    desc = h.desc;
    const size_t bytes = h.bytes.size();
    if (bytes == 0) return;
    EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, h.bytes.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    desc.data = ptr;
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() {
    if (ptr) cudaFree(ptr);
  }
};

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

// Until the sm_90a kernels land the CUDA path says so, clearly, and never
// falls back to the CPU.
TEST_F(CudaBackend, ForwardAndBackwardReportMissingKernels) {
  flashqla_gdn_fwd_params_t p = device_params();
  EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_NOT_SUPPORTED);
  EXPECT_THAT(flashqla_last_error_message(), HasSubstr("sm_90a GDN forward kernel"));
}

}  // namespace
}  // namespace flashqla_test
