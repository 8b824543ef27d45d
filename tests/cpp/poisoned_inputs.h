// What a NaN in one sequence's inputs may reach: that sequence, and within it
// the poisoned head's GQA group (the q/k head and its value heads). Every
// other element of every output must come out exactly as in a clean run.
// Shared by the CPU suite and the GPU suite, each with its own way to run a
// case (`run` computes the forward and the backward into the case's outputs).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "test_support.h"

namespace flashqla_test {

struct PoisonedInput {
  const char* input;  // "q", "k", "v", "g" or "beta"
  double value;       // NaN or ±Inf
};

// Packed sequences (one empty), two q/k heads of two value heads each; the
// poison goes into sequence 2's token 5, q/k head 1 or value head 3.
inline GdnCase poisoned_inputs_case(flashqla_dtype_t dtype, int64_t K, int64_t V) {
  GdnCase c;
  c.cu_seqlens = {0, 70, 70, 200, 330};
  c.H = 2;
  c.HV = 4;
  c.K = K;
  c.V = V;
  c.dtype = dtype;
  if (dtype != FLASHQLA_DTYPE_FLOAT64) {
    c.gate_dtype = FLASHQLA_DTYPE_FLOAT32;
    c.state_dtype = FLASHQLA_DTYPE_FLOAT32;
  }
  c.with_h0 = c.with_dht = true;
  c.allocate_and_fill(0x5a1e);
  return c;
}

template <typename Run>
void check_poison_stays_in_its_sequence_and_group(const GdnCase& base, const PoisonedInput& poison, Run run) {
  constexpr int64_t kSeq = 2, kQkHead = 1, kValueHead = 3;
  const int64_t group = base.HV / base.H, t0 = base.cu_seqlens[kSeq] + 5;
  GdnCase clean = base, bad = base;
  run(clean);
  const std::string in = poison.input;
  HostTensor& target = in == "q" ? bad.q : in == "k" ? bad.k : in == "v" ? bad.v : in == "g" ? bad.g : bad.beta;
  const int64_t head = (in == "q" || in == "k") ? kQkHead : kValueHead;
  // Logical row-major index of [1, T, heads(, D)] at (token t0, head, 0).
  const int64_t inner_of_target = target.shape.size() == 4 ? target.shape[3] : 1;
  target.set_flat((t0 * target.shape[2] + head) * inner_of_target, poison.value);
  run(bad);
  const int64_t poisoned_group = head / ((in == "q" || in == "k") ? 1 : group);

  // Token-major outputs [B, T, heads(, D)]: elements of sequence kSeq in the
  // poisoned group may differ; state outputs [N, HV, ..]: sequence kSeq's.
  auto token_in_seq = [&](int64_t t) { return t >= base.cu_seqlens[kSeq] && t < base.cu_seqlens[kSeq + 1]; };
  struct Out {
    const char* name;
    const HostTensor* clean;
    const HostTensor* bad;
    bool per_token, qk_heads;
  } outs[] = {{"o", &clean.o, &bad.o, true, false},        {"final state", &clean.ht, &bad.ht, false, false},
              {"dq", &clean.dq, &bad.dq, true, true},      {"dk", &clean.dk, &bad.dk, true, true},
              {"dv", &clean.dv, &bad.dv, true, false},     {"dg", &clean.dg, &bad.dg, true, false},
              {"dbeta", &clean.dbeta, &bad.dbeta, true, false}, {"dh0", &clean.dh0, &bad.dh0, false, false}};
  bool reached = false;
  for (const Out& o : outs) {
    const std::vector<double> a = o.clean->to_vector(), b = o.bad->to_vector();
    const std::vector<int64_t>& shape = o.clean->shape;
    const int64_t heads = shape[2 - (o.per_token ? 0 : 1)];
    int64_t inner = 1;
    for (size_t d = o.per_token ? 3 : 2; d < shape.size(); ++d) inner *= shape[d];
    int64_t leaks = 0;
    for (int64_t i = 0; i < int64_t(a.size()); ++i) {
      const int64_t row = i / inner / heads, h = (i / inner) % heads;  // row: token or sequence
      const int64_t group_of_h = o.qk_heads ? h : h / group;
      const bool may_differ = (o.per_token ? token_in_seq(row) : row == kSeq) && group_of_h == poisoned_group;
      if (may_differ) {
        reached = reached || !std::isfinite(b[i]);
        continue;
      }
      if (!(a[i] == b[i]) && !(std::isnan(a[i]) && std::isnan(b[i]))) ++leaks;
    }
    EXPECT_EQ(leaks, 0) << poison.input << " = " << poison.value << ": " << o.name << " has " << leaks
                        << " elements outside the poisoned sequence and group that differ from a clean run";
  }
  EXPECT_TRUE(reached) << poison.input << ": the poison reached no output (the case does not test containment)";
}

}  // namespace flashqla_test
