// Differential fuzzing on the GPU: random cases (fuzz_cases.h, the GPU's
// dtypes and head sizes) through the CUDA backend against the CPU backend in
// fp64 on the same (rounded) inputs, forward (o, final state) and backward
// (every gradient), outputs poisoned with NaN first. FLASHQLA_FUZZ_GPU_CASES
// cases in all (500 by default), seeds 1.., split into kShards tests so each
// stays short; each shard prints every output's worst error with its seed.
// Skips where no CUDA device exists.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cuda_test_support.h"
#include "fuzz_cases.h"
#include "test_support.h"

namespace flashqla_test {
namespace {

constexpr int kShards = 10;

int64_t total_cases() {
  const char* v = std::getenv("FLASHQLA_FUZZ_GPU_CASES");
  return v != nullptr && *v != '\0' ? std::atoll(v) : 500;
}

// The suites' tolerances: bf16 and fp16 (o, states and gradients; dg looser),
// fp32 inputs tighter.
double tolerance(flashqla_dtype_t dtype, const std::string& output) {
  if (dtype == FLASHQLA_DTYPE_FLOAT32) return 2e-4;
  if (output == "o" || output == "ht") return 0.005;
  return output == "dg" ? 0.02 : 0.008;
}

// The forward of one case on the GPU against `ref`'s fp64 outputs.
void check_forward(FuzzCase& f, const GdnCase& ref, std::vector<WorstError>& worst) {
  GdnCase& c = f.c;
  std::vector<std::unique_ptr<DeviceTensor>> dev;
  for (HostTensor* t : {&c.q, &c.k, &c.v, &c.g, &c.beta, &c.h0, &c.o, &c.ht, &c.cu})
    dev.emplace_back(std::make_unique<DeviceTensor>(*t));
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  p.backend = FLASHQLA_BACKEND_AUTO;
  flashqla_tensor_t* slots[] = {&p.q, &p.k, &p.v, &p.g, &p.beta, &p.initial_state, &p.o, &p.final_state,
                                &p.cu_seqlens};
  for (size_t i = 0; i < dev.size(); ++i) *slots[i] = dev[i]->desc;
  if (!c.with_h0) p.initial_state = flashqla_tensor_t{};
  if (c.cu_seqlens.empty()) p.cu_seqlens = flashqla_tensor_t{};
  size_t ws_bytes = 0;
  ASSERT_EQ(flashqla_gdn_fwd_workspace_size(&p, &ws_bytes), FLASHQLA_STATUS_SUCCESS)
      << f.description << ": " << flashqla_last_error_message();
  const DeviceWorkspace workspace(ws_bytes);
  p.workspace = workspace.ptr;
  p.workspace_bytes = workspace.bytes;
  poison(*dev[6], c.o.bytes.size());
  poison(*dev[7], c.ht.bytes.size());
  ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << f.description << ": " << flashqla_last_error_message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << f.description;
  const HostTensor o = with_bytes(c.o, download(*dev[6], c.o.bytes.size()));
  const HostTensor ht = with_bytes(c.ht, download(*dev[7], c.ht.bytes.size()));
  const double eo = rel_error(o.to_vector(), ref.o.to_vector());
  const double eht = rel_error(ht.to_vector(), ref.ht.to_vector());
  worst[0].update(eo, f);
  worst[1].update(eht, f);
  EXPECT_LE(eo, tolerance(c.dtype, "o")) << f.description << ": o";
  EXPECT_LE(eht, tolerance(c.dtype, "ht")) << f.description << ": final state";
}

// The backward of one case on the GPU against `ref`'s fp64 gradients.
void check_backward(FuzzCase& f, const GdnCase& ref, std::vector<WorstError>& worst) {
  GdnCase& c = f.c;
  HostTensor* host[] = {&c.q, &c.k, &c.v, &c.g, &c.beta, &c.h0, &c.cu, &c.d_o, &c.dht,
                        &c.dq, &c.dk, &c.dv, &c.dg, &c.dbeta, &c.dh0};
  std::vector<std::unique_ptr<DeviceTensor>> dev;
  for (HostTensor* t : host) dev.emplace_back(std::make_unique<DeviceTensor>(*t));
  flashqla_gdn_bwd_params_t p = c.bwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  p.fwd.backend = FLASHQLA_BACKEND_AUTO;
  flashqla_tensor_t* slots[] = {&p.fwd.q, &p.fwd.k, &p.fwd.v, &p.fwd.g, &p.fwd.beta, &p.fwd.initial_state,
                                &p.fwd.cu_seqlens, &p.d_o, &p.d_final_state, &p.dq, &p.dk, &p.dv, &p.dg,
                                &p.dbeta, &p.d_initial_state};
  for (size_t i = 0; i < dev.size(); ++i) *slots[i] = dev[i]->desc;
  if (!c.with_h0) p.fwd.initial_state = p.d_initial_state = flashqla_tensor_t{};
  if (!c.with_dht) p.d_final_state = flashqla_tensor_t{};
  if (c.cu_seqlens.empty()) p.fwd.cu_seqlens = flashqla_tensor_t{};
  size_t ws_bytes = 0;
  ASSERT_EQ(flashqla_gdn_bwd_workspace_size(&p, &ws_bytes), FLASHQLA_STATUS_SUCCESS)
      << f.description << ": " << flashqla_last_error_message();
  const DeviceWorkspace workspace(ws_bytes);
  p.fwd.workspace = workspace.ptr;
  p.fwd.workspace_bytes = workspace.bytes;
  for (size_t i = 9; i < dev.size(); ++i) poison(*dev[i], host[i]->bytes.size());
  ASSERT_EQ(flashqla_gdn_bwd(&p), FLASHQLA_STATUS_SUCCESS) << f.description << ": " << flashqla_last_error_message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << f.description;
  const HostTensor* expected[] = {&ref.dq, &ref.dk, &ref.dv, &ref.dg, &ref.dbeta, &ref.dh0};
  for (size_t i = 0; i < 6; ++i) {
    WorstError& w = worst[2 + i];
    if (w.output == "dh0" && !c.with_h0) continue;
    const HostTensor got = with_bytes(*host[9 + i], download(*dev[9 + i], host[9 + i]->bytes.size()));
    const double e = rel_error(got.to_vector(), expected[i]->to_vector());
    w.update(e, f);
    EXPECT_LE(e, tolerance(c.dtype, w.output)) << f.description << ": " << w.output;
  }
}

class GpuFuzz : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_P(GpuFuzz, MatchesCpuOracle) {
  const int shard = GetParam();
  const int64_t total = total_cases(), per = (total + kShards - 1) / kShards;
  std::vector<WorstError> worst = fuzz_outputs();
  int64_t ran = 0;
  for (int64_t seed = 1 + shard * per; seed <= std::min(total, (shard + 1) * per); ++seed, ++ran) {
    FuzzCase f = fuzz_case(uint64_t(seed), FuzzTarget::kGpu);
    f.fill();
    // The oracle: the CPU backend on the same rounded inputs, fp64 outputs.
    GdnCase ref = f.c;
    for (HostTensor* t : {&ref.o, &ref.ht, &ref.dq, &ref.dk, &ref.dv, &ref.dg, &ref.dbeta, &ref.dh0}) {
      if (!t->shape.empty()) *t = HostTensor(t->shape, FLASHQLA_DTYPE_FLOAT64);
    }
    flashqla_gdn_fwd_params_t rf = ref.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
    ASSERT_EQ(flashqla_gdn_fwd(&rf), FLASHQLA_STATUS_SUCCESS) << f.description << ": " << flashqla_last_error_message();
    flashqla_gdn_bwd_params_t rb = ref.bwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
    ASSERT_EQ(flashqla_gdn_bwd(&rb), FLASHQLA_STATUS_SUCCESS) << f.description << ": " << flashqla_last_error_message();
    check_forward(f, ref, worst);
    check_backward(f, ref, worst);
  }
  print_worst_errors(("GPU against the CPU backend (fp64), shard " + std::to_string(shard) + ", " +
                      std::to_string(ran) + " cases")
                         .c_str(),
                     worst);
}

INSTANTIATE_TEST_SUITE_P(Cuda, GpuFuzz, ::testing::Range(0, kShards),
                         [](const auto& info) { return "shard" + std::to_string(info.param); });

}  // namespace
}  // namespace flashqla_test
