// A NaN or Inf in one sequence's inputs stays in that sequence and its head's
// GQA group (poisoned_inputs.h), on the CPU backend (both algorithms).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "poisoned_inputs.h"
#include "test_support.h"

namespace flashqla_test {
namespace {

class PoisonedInputs : public ::testing::TestWithParam<flashqla_cpu_algorithm_t> {};

TEST_P(PoisonedInputs, StayInTheirSequenceAndGroup) {
  const flashqla_cpu_algorithm_t algo = GetParam();
  auto run = [algo](GdnCase& c) {
    c.poison_outputs();
    flashqla_gdn_fwd_params_t p = c.fwd_params(algo);
    ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
    flashqla_gdn_bwd_params_t b = c.bwd_params(algo);
    ASSERT_EQ(flashqla_gdn_bwd(&b), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  };
  const GdnCase base = poisoned_inputs_case(FLASHQLA_DTYPE_FLOAT64, 16, 16);
  const double inf = std::numeric_limits<double>::infinity();
  for (const PoisonedInput& p : {PoisonedInput{"q", NAN}, PoisonedInput{"k", inf}, PoisonedInput{"v", NAN},
                                 PoisonedInput{"g", NAN}, PoisonedInput{"beta", inf}}) {
    check_poison_stays_in_its_sequence_and_group(base, p, run);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, PoisonedInputs,
                         ::testing::Values(FLASHQLA_CPU_ALGORITHM_CHUNKED, FLASHQLA_CPU_ALGORITHM_RECURRENT),
                         [](const auto& info) {
                           return info.param == FLASHQLA_CPU_ALGORITHM_CHUNKED ? std::string("chunked")
                                                                               : std::string("recurrent");
                         });

}  // namespace
}  // namespace flashqla_test
