// Random GDN problems for differential fuzzing: a seed gives a case (sizes,
// sequence lengths, options, dtypes, gate and beta regimes), the same one on
// every machine, with a one-line description that names it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "test_support.h"

namespace flashqla_test {

// Where a case runs: the CPU algorithms against each other (fp64, small head
// sizes, short sequences), or the CUDA backend against the CPU backend (the
// GPU's dtypes and head sizes, the fast path's K = V = 128 most often).
enum class FuzzTarget { kCpu, kGpu };

struct FuzzCase {
  uint64_t seed = 0;
  GdnCase c;              // sizes and options set, tensors not yet allocated
  double g_value = NAN;   // allocate_and_fill's gate / beta overrides
  double beta_value = NAN;
  double gate_div = 4.0;
  std::string description;

  // Allocates and fills the case's tensors from its seed.
  void fill() { c.allocate_and_fill(seed, g_value, beta_value, gate_div); }
};

FuzzCase fuzz_case(uint64_t seed, FuzzTarget target);

// How many cases a run checks: the environment variable `name` when set, else
// `fallback`.
int64_t fuzz_case_count(const char* name, int64_t fallback);

// The worst error seen so far for one output, with the case that made it.
struct WorstError {
  std::string output;
  double error = 0.0;
  uint64_t seed = 0;
  std::string description;
  void update(double e, const FuzzCase& f) {
    if (!(e <= error)) {  // NaN counts as worse than anything
      error = e;
      seed = f.seed;
      description = f.description;
    }
  }
};

// The outputs a case checks, in this order: o, ht, dq, dk, dv, dg, dbeta, dh0.
std::vector<WorstError> fuzz_outputs();

// Prints one line per output: the worst error and the seed (and case) behind it.
void print_worst_errors(const char* title, const std::vector<WorstError>& worst);

}  // namespace flashqla_test
