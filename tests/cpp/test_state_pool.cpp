// The serving entry on the CPU backend (state_indices): a pool updated in
// place matches the plain forward on the states gathered from it, rows no
// sequence takes stay untouched, and bad indices are refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "state_pool_cases.h"
#include "test_support.h"

namespace flashqla_test {
namespace {

class StatePool : public ::testing::TestWithParam<int> {};

TEST_P(StatePool, MatchesThePlainForwardInPlace) {
  PoolCase pc = cpu_pool_case(size_t(GetParam()));
  const HostTensor before = pc.pool;
  pc.c.o.fill_nan();
  flashqla_gdn_fwd_params_t p = pc.params();
  ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << pc.name << ": " << flashqla_last_error_message();
  // The same fp64 computation as the plain call: identical values.
  EXPECT_EQ(pc.c.o.to_vector(), pc.expected_o.to_vector()) << pc.name;
  EXPECT_EQ(pc.pool.to_vector(), pc.expected_pool.to_vector()) << pc.name;
  std::vector<int64_t> taken;
  for (int64_t s : pc.indices) {
    if (s >= 0) taken.push_back(s);
  }
  for (int64_t row : changed_rows(before, pc.pool, pc.slots)) {
    EXPECT_NE(std::find(taken.begin(), taken.end(), row), taken.end()) << pc.name << ": slot " << row
                                                                         << " changed, no sequence took it";
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, StatePool, ::testing::Range(0, int(cpu_pool_case_names().size())),
                         [](const auto& info) { return cpu_pool_case_names()[size_t(info.param)]; });

// A call with one thing wrong fails with INVALID_ARGUMENT naming it.
void expect_refused(flashqla_gdn_fwd_params_t p, const std::string& needle) {
  EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_INVALID_ARGUMENT) << needle;
  EXPECT_NE(std::string(flashqla_last_error_message()).find(needle), std::string::npos)
      << "message: " << flashqla_last_error_message();
}

TEST(StatePoolValidation, RefusesBadIndicesByName) {
  PoolCase pc = cpu_pool_case(0);
  const int64_t N = pc.c.N();
  HostTensor idx({N}, FLASHQLA_DTYPE_INT32);
  auto with = [&](std::vector<int64_t> v) {
    for (int64_t n = 0; n < N; ++n) idx.set_flat(n, double(v[size_t(n)]));
    flashqla_gdn_fwd_params_t p = pc.params();
    p.state_indices = idx.desc;
    return p;
  };
  std::vector<int64_t> dup(size_t(N), -1);
  dup[0] = dup[2] = 3;
  expect_refused(with(dup), "both take slot 3");
  std::vector<int64_t> past(size_t(N), -1);
  past[1] = pc.slots;
  expect_refused(with(past), "must be below the pool's slot count");

  flashqla_gdn_fwd_params_t no_pool = pc.params();
  no_pool.initial_state = flashqla_tensor_t{};
  expect_refused(no_pool, "given without initial_state");

  flashqla_gdn_fwd_params_t host_only = pc.c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  const int32_t zero = 0;
  host_only.state_indices_host = &zero;
  expect_refused(host_only, "state_indices_host: given without state_indices");

  std::vector<int32_t> other(size_t(N), -1);
  flashqla_gdn_fwd_params_t differs = pc.params();
  differs.state_indices_host = other.data();
  if (pc.indices != std::vector<int64_t>(size_t(N), -1)) expect_refused(differs, "differs from state_indices");

  GdnCase b = pc.c;
  b.with_h0 = true;
  b.allocate_and_fill(3);
  flashqla_gdn_bwd_params_t bp = b.bwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  bp.fwd.state_indices = pc.index_tensor.desc;
  EXPECT_EQ(flashqla_gdn_bwd(&bp), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashqla_last_error_message()).find("forward only"), std::string::npos)
      << flashqla_last_error_message();
}

}  // namespace
}  // namespace flashqla_test
