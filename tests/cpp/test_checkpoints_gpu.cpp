// State checkpoints on the CUDA backend against the CPU backend's (fp64, the
// same inputs): the tensor-core forward over whole sequences and over sequence
// pieces (a long sequence among few heads), and the simple kernel; rows no
// checkpoint takes stay as they were (NaN). Skips where no CUDA device exists.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "test_support.h"

namespace flashqla_test {
namespace {

struct GpuCheckpointCase {
  std::string name;
  std::vector<int64_t> cu_seqlens;
  int64_t H, HV, K, V, every;
  flashqla_dtype_t dtype;
  bool v_first;
};

class GpuCheckpoints : public ::testing::TestWithParam<GpuCheckpointCase> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_P(GpuCheckpoints, MatchTheCpuBackend) {
  const GpuCheckpointCase& k = GetParam();
  GdnCase c;
  c.B = 1, c.T = k.cu_seqlens.back(), c.cu_seqlens = k.cu_seqlens;
  c.H = k.H, c.HV = k.HV, c.K = k.K, c.V = k.V;
  c.dtype = k.dtype, c.gate_dtype = FLASHQLA_DTYPE_FLOAT32, c.state_dtype = FLASHQLA_DTYPE_FLOAT32;
  c.state_v_first = k.v_first;
  c.with_h0 = true;
  c.allocate_and_fill(17);
  const int64_t rows = c.T / (64 * k.every) + 1;
  const std::vector<int64_t> shape = k.v_first ? std::vector<int64_t>{rows, c.HV, c.V, c.K}
                                               : std::vector<int64_t>{rows, c.HV, c.K, c.V};
  HostTensor cpu_ckpt(shape, FLASHQLA_DTYPE_FLOAT64), gpu_ckpt(shape, FLASHQLA_DTYPE_FLOAT32);
  cpu_ckpt.fill_nan();
  gpu_ckpt.fill_nan();

  GdnCase ref = c;
  flashqla_gdn_fwd_params_t rp = ref.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  rp.checkpoints = cpu_ckpt.desc, rp.checkpoints_n = rows, rp.checkpoint_chunks = k.every;
  ASSERT_EQ(flashqla_gdn_fwd(&rp), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();

  DeviceForwardCall call(c);
  DeviceTensor dev_ckpt(gpu_ckpt);
  call.p.checkpoints = dev_ckpt.desc, call.p.checkpoints_n = rows, call.p.checkpoint_chunks = k.every;
  size_t bytes = 0;
  ASSERT_EQ(flashqla_gdn_fwd_workspace_size(&call.p, &bytes), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  DeviceWorkspace ws(bytes);
  call.p.workspace = ws.ptr, call.p.workspace_bytes = ws.bytes;
  ASSERT_EQ(flashqla_gdn_fwd(&call.p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor got = with_bytes(gpu_ckpt, download(dev_ckpt, gpu_ckpt.bytes.size()));
  const std::vector<double> a = got.to_vector(), b = cpu_ckpt.to_vector();
  std::vector<double> written_a, written_b;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(std::isnan(a[i]), std::isnan(b[i])) << k.name << ": element " << i << " written by one backend only";
    if (!std::isnan(b[i])) {
      written_a.push_back(a[i]);
      written_b.push_back(b[i]);
    }
  }
  EXPECT_FALSE(written_b.empty()) << k.name;
  EXPECT_LE(rel_error(written_a, written_b), k.dtype == FLASHQLA_DTYPE_FLOAT32 ? 2e-4 : 0.005) << k.name;
}

INSTANTIATE_TEST_SUITE_P(
    Cuda, GpuCheckpoints,
    ::testing::Values(
        GpuCheckpointCase{"tc_every_chunk", {0, 100, 100, 357, 420, 1000}, 2, 4, 128, 128, 1, FLASHQLA_DTYPE_BFLOAT16,
                          false},
        GpuCheckpointCase{"tc_every_4_vfirst", {0, 64, 1300, 1301}, 1, 2, 128, 128, 4, FLASHQLA_DTYPE_BFLOAT16, true},
        GpuCheckpointCase{"tc_pieces_every_8", {0, 8192, 8200}, 1, 1, 128, 128, 8, FLASHQLA_DTYPE_BFLOAT16, false},
        GpuCheckpointCase{"simple_fp32_every_2", {0, 33, 300, 429}, 1, 3, 40, 24, 2, FLASHQLA_DTYPE_FLOAT32, false}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace flashqla_test
