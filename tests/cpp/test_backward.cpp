// CPU backward: chunked against recurrent (fp64, relative error <= 1e-10)
// over the edge cases, and both against central finite differences of the
// forward for every input (q, k, v, g, beta, h0), with and without dht.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_support.h"

namespace flashqla_test {
namespace {

struct Grads {
  std::vector<double> dq, dk, dv, dg, dbeta, dh0;
};

Grads run_backward(GdnCase& c, flashqla_cpu_algorithm_t algo) {
  c.poison_outputs();
  flashqla_gdn_bwd_params_t p = c.bwd_params(algo);
  const flashqla_status_t st = flashqla_gdn_bwd(&p);
  EXPECT_EQ(st, FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  Grads g{c.dq.to_vector(), c.dk.to_vector(), c.dv.to_vector(),
          c.dg.to_vector(), c.dbeta.to_vector(), c.with_h0 ? c.dh0.to_vector() : std::vector<double>{}};
  for (const auto* x : {&g.dq, &g.dk, &g.dv, &g.dg, &g.dbeta, &g.dh0})
    EXPECT_FALSE(any_nan(*x)) << "a gradient has unwritten (NaN) elements";
  return g;
}

void expect_grads_close(const Grads& a, const Grads& b, double tol, const std::string& what) {
  EXPECT_LE(rel_error(a.dq, b.dq), tol) << what << " dq";
  EXPECT_LE(rel_error(a.dk, b.dk), tol) << what << " dk";
  EXPECT_LE(rel_error(a.dv, b.dv), tol) << what << " dv";
  EXPECT_LE(rel_error(a.dg, b.dg), tol) << what << " dg";
  EXPECT_LE(rel_error(a.dbeta, b.dbeta), tol) << what << " dbeta";
  EXPECT_LE(rel_error(a.dh0, b.dh0), tol) << what << " dh0";
}

struct BwdConfig {
  std::string name;
  int64_t B = 1, T = 0, H = 1, HV = 1, K = 16, V = 16;
  std::vector<int64_t> cu_seqlens;
  bool h0 = true, dht = true, v_first = false, l2norm = false;
  double g_value = NAN, beta_value = NAN;
  flashqla_beta_activation_t beta_act = FLASHQLA_BETA_IDENTITY;
};

GdnCase make_case(const BwdConfig& f, uint64_t seed) {
  GdnCase c;
  c.B = f.B;
  c.T = f.T;
  c.H = f.H;
  c.HV = f.HV;
  c.K = f.K;
  c.V = f.V;
  c.cu_seqlens = f.cu_seqlens;
  c.with_h0 = f.h0;
  c.with_dht = f.dht;
  c.state_v_first = f.v_first;
  c.l2norm = f.l2norm;
  c.beta_act = f.beta_act;
  c.allocate_and_fill(seed, f.g_value, f.beta_value);
  return c;
}

class BackwardChunkedVsRecurrent : public ::testing::TestWithParam<BwdConfig> {};

TEST_P(BackwardChunkedVsRecurrent, Fp64) {
  GdnCase c = make_case(GetParam(), 0xbacc + GetParam().T);
  const Grads rec = run_backward(c, FLASHQLA_CPU_ALGORITHM_RECURRENT);
  const Grads chk = run_backward(c, FLASHQLA_CPU_ALGORITHM_CHUNKED);
  expect_grads_close(chk, rec, 1e-10, GetParam().name);
}

std::vector<BwdConfig> backward_configs() {
  std::vector<BwdConfig> v;
  for (int64_t T : {0, 1, 63, 64, 65, 127, 300}) {
    BwdConfig f;
    f.name = "len" + std::to_string(T);
    f.B = 2;
    f.T = T;
    f.HV = 2;
    v.push_back(f);
  }
  {
    BwdConfig f;
    f.name = "varlen_with_empty";
    f.cu_seqlens = {0, 0, 1, 64, 64, 129, 200, 200};
    f.T = 200;
    f.H = 2;
    f.HV = 4;
    v.push_back(f);
  }
  for (int64_t ratio : {1, 2, 3, 4, 8}) {
    BwdConfig f;
    f.name = "gqa" + std::to_string(ratio);
    f.T = 100;
    f.H = 2;
    f.HV = 2 * ratio;
    v.push_back(f);
  }
  for (int64_t d : {32, 100, 256}) {
    BwdConfig f;
    f.name = "K" + std::to_string(d) + "_V" + std::to_string(d == 256 ? 64 : d);
    f.T = 130;
    f.K = d;
    f.V = d == 256 ? 64 : d;
    v.push_back(f);
  }
  {
    BwdConfig f;
    f.T = 150;
    f.HV = 2;
    append_gate_and_beta_edge_cases(v, f);
    f.name = "no_h0_no_dht";
    f.h0 = false;
    f.dht = false;
    v.push_back(f);
    f.name = "h0_no_dht";
    f.h0 = true;
    v.push_back(f);
    f.dht = true;
    f.name = "state_v_first";
    f.v_first = true;
    f.K = 12;
    f.V = 20;
    v.push_back(f);
    f.v_first = false;
    f.name = "l2norm_in_op";
    f.l2norm = true;
    v.push_back(f);
    f.l2norm = false;
    f.name = "beta_sigmoid_x2";
    f.beta_act = FLASHQLA_BETA_SIGMOID_X2;
    v.push_back(f);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackwardChunkedVsRecurrent, ::testing::ValuesIn(backward_configs()),
                         [](const auto& info) { return info.param.name; });

// --- finite differences ------------------------------------------------------

// L = Σ d_o ⊙ o + Σ dht ⊙ ht, whose gradient the backward computes.
double loss(GdnCase& c) {
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_RECURRENT);
  p.cpu_num_threads = 1;
  EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  double acc = 0.0;
  const std::vector<double> o = c.o.to_vector(), d_o = c.d_o.to_vector();
  for (size_t i = 0; i < o.size(); ++i) acc += o[i] * d_o[i];
  if (c.with_dht) {
    const std::vector<double> ht = c.ht.to_vector(), dht = c.dht.to_vector();
    for (size_t i = 0; i < ht.size(); ++i) acc += ht[i] * dht[i];
  }
  return acc;
}

std::vector<double> finite_difference(GdnCase& c, HostTensor& x) {
  constexpr double eps = 1e-6;
  std::vector<double> grad(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double x0 = x.get_flat(i);
    x.set_flat(i, x0 + eps);
    const double up = loss(c);
    x.set_flat(i, x0 - eps);
    const double down = loss(c);
    x.set_flat(i, x0);
    grad[size_t(i)] = (up - down) / (2 * eps);
  }
  return grad;
}

struct FdConfig {
  std::string name;
  bool dht, l2norm, v_first;
  flashqla_beta_activation_t beta_act;
};

class FiniteDifferences : public ::testing::TestWithParam<FdConfig> {};

TEST_P(FiniteDifferences, EveryInputBothAlgorithms) {
  const FdConfig& f = GetParam();
  GdnCase c;
  c.cu_seqlens = {0, 0, 5, 75};  // an empty sequence, a short one, one across two chunks
  c.H = 1;
  c.HV = 2;
  c.K = 5;
  c.V = 3;
  c.with_h0 = true;
  c.with_dht = f.dht;
  c.l2norm = f.l2norm;
  c.state_v_first = f.v_first;
  c.beta_act = f.beta_act;
  c.scale = 0.7;
  c.allocate_and_fill(2024, NAN, NAN, 2.0);

  Grads fd;
  fd.dq = finite_difference(c, c.q);
  fd.dk = finite_difference(c, c.k);
  fd.dv = finite_difference(c, c.v);
  fd.dg = finite_difference(c, c.g);
  fd.dbeta = finite_difference(c, c.beta);
  fd.dh0 = finite_difference(c, c.h0);
  for (auto algo : {FLASHQLA_CPU_ALGORITHM_RECURRENT, FLASHQLA_CPU_ALGORITHM_CHUNKED}) {
    const Grads analytic = run_backward(c, algo);
    expect_grads_close(analytic, fd, 1e-6,
                       f.name + (algo == FLASHQLA_CPU_ALGORITHM_CHUNKED ? " chunked" : " recurrent"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, FiniteDifferences,
    ::testing::Values(FdConfig{"plain_with_dht", true, false, false, FLASHQLA_BETA_IDENTITY},
                      FdConfig{"plain_without_dht", false, false, false, FLASHQLA_BETA_IDENTITY},
                      FdConfig{"l2norm_sigmoid_v_first", true, true, true, FLASHQLA_BETA_SIGMOID},
                      FdConfig{"sigmoid_x2_without_dht", false, false, false, FLASHQLA_BETA_SIGMOID_X2}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace flashqla_test
