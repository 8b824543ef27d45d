// The wgmma operand layouts (tests/cpp/wgmma_layout_cases.cu) against a host
// GEMM; skips where no CUDA device exists.
#include <gtest/gtest.h>

#include "cuda_test_support.h"
#include "wgmma_layout_cases.h"

namespace flashqla_test {
namespace {

class WgmmaLayout : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (!have_cuda_device()) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST_P(WgmmaLayout, MatchesHostGemm) {
  const WgmmaLayoutResult r = run_wgmma_layout_case(GetParam());
  ASSERT_EQ(r.error, "") << r.name;
  EXPECT_LE(r.max_rel_error, 1e-5) << r.name;
}

INSTANTIATE_TEST_SUITE_P(Sm90, WgmmaLayout,
                         ::testing::Range(0, static_cast<int>(wgmma_layout_case_names().size())),
                         [](const auto& info) { return wgmma_layout_case_names()[info.param]; });

}  // namespace
}  // namespace flashqla_test
