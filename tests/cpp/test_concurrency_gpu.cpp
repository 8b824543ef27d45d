// The C API called from several host threads at once on the CUDA backend, each
// on its own non-blocking stream with its own buffers and workspace: every
// thread's forward and backward give the same bits as the same calls made one
// after another on the default stream; the calls of a forward captured into a
// CUDA graph on a non-default stream replay to the same bits. Skips where no
// CUDA device exists.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "cuda_test_support.h"
#include "test_support.h"

namespace flashqla_test {
namespace {

constexpr int kCallers = 8;

// Tensor-core shapes (K = V = 128, bf16) and the simple kernels' (K = V = 64,
// fp32) in turn, packed sequences of different lengths per caller.
GdnCase concurrency_case(int caller) {
  GdnCase c;
  c.cu_seqlens = {0, 100 + 37 * caller, 100 + 37 * caller, 700};
  c.H = 1 + caller % 2;
  c.HV = 2 * c.H;
  c.K = c.V = caller % 2 == 0 ? 128 : 64;
  c.dtype = caller % 2 == 0 ? FLASHQLA_DTYPE_BFLOAT16 : FLASHQLA_DTYPE_FLOAT32;
  c.gate_dtype = c.state_dtype = FLASHQLA_DTYPE_FLOAT32;
  c.with_h0 = c.with_dht = true;
  c.l2norm = caller % 3 == 0;
  c.allocate_and_fill(200 + caller);
  return c;
}

std::vector<std::vector<unsigned char>> outputs_of(const GdnCase& c) {
  std::vector<std::vector<unsigned char>> v;
  for (const HostTensor* t : {&c.o, &c.ht, &c.dq, &c.dk, &c.dv, &c.dg, &c.dbeta, &c.dh0}) v.push_back(t->bytes);
  return v;
}

class GpuConcurrency : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_F(GpuConcurrency, CallsFromManyThreadsOnTheirStreamsMatchSerialCalls) {
  std::vector<GdnCase> serial, concurrent;
  for (int i = 0; i < kCallers; ++i) {
    serial.push_back(concurrency_case(i));
    concurrent.push_back(concurrency_case(i));
  }
  for (int i = 0; i < kCallers; ++i) {
    run_forward_on_device(serial[i], "serial " + std::to_string(i));
    run_backward_on_device(serial[i], "serial " + std::to_string(i));
  }
  std::vector<cudaStream_t> streams(kCallers);
  for (cudaStream_t& s : streams) ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    std::vector<std::thread> threads;
    for (int i = 0; i < kCallers; ++i) {
      threads.emplace_back([&, i] {
        const std::string what = "caller " + std::to_string(i);
        run_forward_on_device(concurrent[i], what, streams[i]);
        run_backward_on_device(concurrent[i], what, streams[i]);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int i = 0; i < kCallers; ++i) {
      EXPECT_EQ(outputs_of(concurrent[i]), outputs_of(serial[i])) << "caller " << i << ", round " << round;
    }
  }
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

// A forward captured on a non-default stream (buffers and workspace allocated
// first), replayed twice: the same bits as a direct call.
TEST_F(GpuConcurrency, ForwardCapturedOnANonDefaultStreamReplays) {
  GdnCase c = concurrency_case(0);
  GdnCase direct = c;
  run_forward_on_device(direct, "direct");

  DeviceForwardCall call(c);
  flashqla_gdn_fwd_params_t& p = call.p;
  // The host copy of cu_seqlens: planning reads no device memory during capture.
  std::vector<int32_t> cu_host(c.cu_seqlens.begin(), c.cu_seqlens.end());
  p.cu_seqlens_host = cu_host.data();
  size_t ws_bytes = 0;
  ASSERT_EQ(flashqla_gdn_fwd_workspace_size(&p, &ws_bytes), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  const DeviceWorkspace workspace(ws_bytes);
  p.workspace = workspace.ptr;
  p.workspace_bytes = workspace.bytes;
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  p.stream = stream;

  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const flashqla_status_t st = flashqla_gdn_fwd(&p);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(st, FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    poison(call.o(), c.o.bytes.size(), stream);
    poison(call.ht(), c.ht.bytes.size(), stream);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(download(call.o(), c.o.bytes.size()), direct.o.bytes) << "o, replay " << replay;
    EXPECT_EQ(download(call.ht(), c.ht.bytes.size()), direct.ht.bytes) << "final state, replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace flashqla_test
