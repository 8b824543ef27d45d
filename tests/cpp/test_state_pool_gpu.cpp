// The serving entry on the CUDA backend (state_indices): the pool, on the
// device, read and written in place at random slots with -1 among them,
// against the plain forward on the CPU in fp64 (state_pool_cases.h): o and
// the slots taken within the suites' tolerance, every other row bit for bit
// as it was; then the same call captured in a CUDA graph and replayed with
// new indices. Skips where no CUDA device exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "state_pool_cases.h"

namespace flashqla_test {
namespace {

class GpuStatePool : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

// The pooled call on the device over `pc`'s inputs; returns the pool and o
// read back.
struct DevicePoolCall {
  DeviceForwardCall call;
  DeviceTensor pool, indices;
  DeviceWorkspace ws;
  static size_t workspace_for(flashqla_gdn_fwd_params_t p) {
    size_t bytes = 0;
    EXPECT_EQ(flashqla_gdn_fwd_workspace_size(&p, &bytes), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
    return bytes;
  }
  explicit DevicePoolCall(PoolCase& pc)
      : call(pc.c), pool(pc.pool), indices(pc.index_tensor),
        ws(workspace_for(pooled_params(call.p, pool.desc, indices.desc, pc.slots))) {
    call.p = pooled_params(call.p, pool.desc, indices.desc, pc.slots);
    call.p.workspace = ws.ptr;
    call.p.workspace_bytes = ws.bytes;
  }
};

TEST_P(GpuStatePool, MatchesThePlainForwardInPlace) {
  PoolCase pc = gpu_pool_case(size_t(GetParam()));
  DevicePoolCall d(pc);
  poison(d.call.o(), pc.c.o.bytes.size());
  ASSERT_EQ(flashqla_gdn_fwd(&d.call.p), FLASHQLA_STATUS_SUCCESS) << pc.name << ": " << flashqla_last_error_message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const HostTensor o = with_bytes(pc.c.o, download(d.call.o(), pc.c.o.bytes.size()));
  const HostTensor pool = with_bytes(pc.pool, download(d.pool, pc.pool.bytes.size()));
  const double tol = pc.c.dtype == FLASHQLA_DTYPE_FLOAT32 ? 2e-4 : 0.005;
  EXPECT_LE(rel_error(o.to_vector(), pc.expected_o.to_vector()), tol) << pc.name << ": o";
  const int64_t row = pc.pool.numel() / pc.slots;
  for (size_t n = 0; n < pc.indices.size(); ++n) {
    const int64_t s = pc.indices[n];
    if (s < 0) continue;
    std::vector<double> got(static_cast<size_t>(row)), want(static_cast<size_t>(row));
    for (int64_t i = 0; i < row; ++i) {
      got[size_t(i)] = pool.get_flat(s * row + i);
      want[size_t(i)] = pc.expected_pool.get_flat(s * row + i);
    }
    EXPECT_LE(rel_error(got, want), tol) << pc.name << ": the final state of sequence " << n << " in slot " << s;
  }
  for (int64_t r : changed_rows(pc.pool, pool, pc.slots)) {
    EXPECT_NE(std::find(pc.indices.begin(), pc.indices.end(), r), pc.indices.end())
        << pc.name << ": slot " << r << " changed, no sequence took it";
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, GpuStatePool, ::testing::Range(0, int(gpu_pool_case_names().size())),
                         [](const auto& info) { return gpu_pool_case_names()[size_t(info.param)]; });

// Captured once, replayed with other indices (and the pool reset): each
// replay reads and writes the slots its indices name at replay time.
TEST(GpuStatePoolGraph, ReplaysWithNewIndices) {
  if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
  PoolCase first = gpu_pool_case(0);
  DevicePoolCall d(first);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  d.call.p.stream = stream;
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(flashqla_gdn_fwd(&d.call.p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  // The same inputs and pool, other slots: the expected result of a case
  // built with the same seed for everything but the indices.
  for (uint64_t round = 0; round < 2; ++round) {
    PoolCase pc = first;
    std::vector<int64_t> idx = pc.indices;
    std::rotate(idx.begin(), idx.begin() + 1 + long(round), idx.end());
    // Rebuild the expectation for the rotated indices on the CPU.
    pc.index_tensor = HostTensor(first.index_tensor.shape, first.index_tensor.dtype);
    for (size_t n = 0; n < idx.size(); ++n) pc.index_tensor.set_flat(int64_t(n), double(idx[n]));
    pc.indices = idx;
    flashqla_gdn_fwd_params_t cp = pc.params();  // the pooled call on the CPU: the expected pool
    HostTensor cpu_pool = first.pool;
    cp.initial_state = cpu_pool.desc;
    cp.final_state = cpu_pool.desc;
    ASSERT_EQ(flashqla_gdn_fwd(&cp), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
    ASSERT_EQ(cudaMemcpy(d.indices.ptr, pc.index_tensor.bytes.data(), pc.index_tensor.bytes.size(),
                         cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d.pool.ptr, first.pool.bytes.data(), first.pool.bytes.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const HostTensor pool = with_bytes(first.pool, download(d.pool, first.pool.bytes.size()));
    EXPECT_LE(rel_error(pool.to_vector(), cpu_pool.to_vector()), 0.005) << "replay " << round;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace flashqla_test
