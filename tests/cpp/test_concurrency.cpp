// The C API called from several host threads at once on the CPU backend: each
// thread's forward and backward give the same bits as the same calls made one
// after another (the backend's own worker threads are shared by the calls).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "test_support.h"

namespace flashqla_test {
namespace {

constexpr int kCallers = 8;

GdnCase concurrency_case(int caller) {
  GdnCase c;
  c.cu_seqlens = {0, 40 + 7 * caller, 40 + 7 * caller, 200};
  c.H = 1 + caller % 2;
  c.HV = 2 * c.H;
  c.K = 16;
  c.V = 8 + caller;
  c.with_h0 = c.with_dht = true;
  c.l2norm = caller % 3 == 0;
  c.allocate_and_fill(100 + caller);
  return c;
}

void run_cpu(GdnCase& c) {
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  flashqla_gdn_bwd_params_t b = c.bwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  ASSERT_EQ(flashqla_gdn_bwd(&b), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
}

std::vector<std::vector<unsigned char>> outputs_of(const GdnCase& c) {
  std::vector<std::vector<unsigned char>> v;
  for (const HostTensor* t : {&c.o, &c.ht, &c.dq, &c.dk, &c.dv, &c.dg, &c.dbeta, &c.dh0}) v.push_back(t->bytes);
  return v;
}

TEST(Concurrency, CpuCallsFromManyThreadsMatchSerialCalls) {
  std::vector<GdnCase> serial, concurrent;
  for (int i = 0; i < kCallers; ++i) {
    serial.push_back(concurrency_case(i));
    concurrent.push_back(concurrency_case(i));
  }
  for (GdnCase& c : serial) run_cpu(c);
  std::vector<std::thread> threads;
  for (int round = 0; round < 3; ++round) {
    for (GdnCase& c : concurrent) c.poison_outputs();
    for (int i = 0; i < kCallers; ++i) threads.emplace_back([&concurrent, i] { run_cpu(concurrent[i]); });
    for (std::thread& t : threads) t.join();
    threads.clear();
    for (int i = 0; i < kCallers; ++i) {
      EXPECT_EQ(outputs_of(concurrent[i]), outputs_of(serial[i])) << "caller " << i << ", round " << round;
    }
  }
}

}  // namespace
}  // namespace flashqla_test
