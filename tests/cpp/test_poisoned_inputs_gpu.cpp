// A NaN or Inf in one sequence's inputs stays in that sequence and its head's
// GQA group (poisoned_inputs.h) on the CUDA backend: the tensor-core forward
// and backward (K = V = 128, bf16) and the simple kernels (K = V = 64, fp32).
// Skips where no CUDA device exists.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "cuda_test_support.h"
#include "poisoned_inputs.h"
#include "test_support.h"

namespace flashqla_test {
namespace {

struct GpuPoisonConfig {
  std::string name;
  flashqla_dtype_t dtype;
  int64_t K, V;
};

class GpuPoisonedInputs : public ::testing::TestWithParam<GpuPoisonConfig> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_P(GpuPoisonedInputs, StayInTheirSequenceAndGroup) {
  const GpuPoisonConfig& f = GetParam();
  auto run = [&f](GdnCase& c) {
    run_forward_on_device(c, f.name);
    run_backward_on_device(c, f.name);
  };
  const GdnCase base = poisoned_inputs_case(f.dtype, f.K, f.V);
  const double inf = std::numeric_limits<double>::infinity();
  for (const PoisonedInput& p : {PoisonedInput{"q", NAN}, PoisonedInput{"k", inf}, PoisonedInput{"v", NAN},
                                 PoisonedInput{"g", NAN}, PoisonedInput{"beta", inf}}) {
    check_poison_stays_in_its_sequence_and_group(base, p, run);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, GpuPoisonedInputs,
                         ::testing::Values(GpuPoisonConfig{"tensor_core_bf16", FLASHQLA_DTYPE_BFLOAT16, 128, 128},
                                           GpuPoisonConfig{"simple_fp32", FLASHQLA_DTYPE_FLOAT32, 64, 64}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace flashqla_test
