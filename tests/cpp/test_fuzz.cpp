// Differential fuzzing on the CPU: random cases (fuzz_cases.h) through both
// CPU algorithms in fp64, the chunked one (what the GPU kernels implement)
// against the per-token recurrence, forward and backward. A fixed list of seeds
// (FLASHQLA_FUZZ_CPU_CASES of them, 200 by default) so every run checks the same
// cases; each output's worst error is printed with the seed that made it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fuzz_cases.h"
#include "test_support.h"

namespace flashqla_test {
namespace {

struct Outputs {
  std::vector<double> o, ht, dq, dk, dv, dg, dbeta, dh0;
};

Outputs run_cpu(FuzzCase& f, flashqla_cpu_algorithm_t algo) {
  GdnCase& c = f.c;
  Outputs out;
  c.poison_outputs();
  flashqla_gdn_fwd_params_t p = c.fwd_params(algo);
  EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << f.description << ": " << flashqla_last_error_message();
  out.o = c.o.to_vector();
  out.ht = c.ht.to_vector();
  flashqla_gdn_bwd_params_t b = c.bwd_params(algo);
  EXPECT_EQ(flashqla_gdn_bwd(&b), FLASHQLA_STATUS_SUCCESS) << f.description << ": " << flashqla_last_error_message();
  out.dq = c.dq.to_vector();
  out.dk = c.dk.to_vector();
  out.dv = c.dv.to_vector();
  out.dg = c.dg.to_vector();
  out.dbeta = c.dbeta.to_vector();
  if (c.with_h0) out.dh0 = c.dh0.to_vector();
  return out;
}

TEST(Fuzz, CpuChunkedMatchesRecurrent) {
  const int64_t cases = fuzz_case_count("FLASHQLA_FUZZ_CPU_CASES", 200);
  const double tol = 1e-9;
  std::vector<WorstError> worst = fuzz_outputs();
  for (int64_t seed = 1; seed <= cases; ++seed) {
    FuzzCase f = fuzz_case(uint64_t(seed), FuzzTarget::kCpu);
    f.fill();
    const Outputs chunked = run_cpu(f, FLASHQLA_CPU_ALGORITHM_CHUNKED);
    const Outputs recurrent = run_cpu(f, FLASHQLA_CPU_ALGORITHM_RECURRENT);
    const std::vector<double>* pairs[][2] = {
        {&chunked.o, &recurrent.o},   {&chunked.ht, &recurrent.ht},       {&chunked.dq, &recurrent.dq},
        {&chunked.dk, &recurrent.dk}, {&chunked.dv, &recurrent.dv},       {&chunked.dg, &recurrent.dg},
        {&chunked.dbeta, &recurrent.dbeta}, {&chunked.dh0, &recurrent.dh0}};
    for (size_t i = 0; i < worst.size(); ++i) {
      const double e = rel_error(*pairs[i][0], *pairs[i][1]);
      worst[i].update(e, f);
      EXPECT_FALSE(any_nan(*pairs[i][0])) << f.description << ": " << worst[i].output << " has unwritten elements";
      EXPECT_LE(e, tol) << f.description << ": " << worst[i].output;
    }
  }
  print_worst_errors(("CPU chunked vs recurrent, fp64, " + std::to_string(cases) + " cases").c_str(), worst);
}

}  // namespace
}  // namespace flashqla_test
