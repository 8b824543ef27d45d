// A minimal fork-join loop over [0, n) for the CPU backend.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace flashqla::cpu {

// Threads to use: `requested` if > 0, else FLASHQLA_NUM_THREADS, else all
// hardware threads; never more than the number of work items.
inline int resolve_num_threads(int requested, int64_t work_items) {
  int n = requested;
  if (n <= 0) {
    const char* env = std::getenv("FLASHQLA_NUM_THREADS");
    n = env ? std::atoi(env) : 0;
  }
  if (n <= 0) n = int(std::max(1u, std::thread::hardware_concurrency()));
  return int(std::max<int64_t>(1, std::min<int64_t>(n, work_items)));
}

// Calls body(i) for every i in [0, n) on `threads` threads. The first
// exception thrown by any call is rethrown here after all threads joined.
template <typename Body>
void parallel_for(int64_t n, int threads, Body&& body) {
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        body(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace flashqla::cpu
