// CPU forward: the chunked algorithm against the per-token recurrence (both
// fp64, relative error <= 1e-10), and the recurrence against a naive oracle
// written here from the definition, over the edge cases of the API.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_support.h"

namespace flashqla_test {
namespace {

constexpr double kFp64Tol = 1e-10;

struct ForwardResult {
  std::vector<double> o, ht;
};

ForwardResult run_forward(GdnCase& c, flashqla_cpu_algorithm_t algo) {
  c.poison_outputs();
  flashqla_gdn_fwd_params_t p = c.fwd_params(algo);
  const flashqla_status_t st = flashqla_gdn_fwd(&p);
  EXPECT_EQ(st, FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  ForwardResult r{c.o.to_vector(), c.ht.to_vector()};
  EXPECT_FALSE(any_nan(r.o)) << "o has unwritten (NaN) elements";
  EXPECT_FALSE(any_nan(r.ht)) << "final state has unwritten (NaN) elements";
  return r;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The definition, token by token, straight from the GdnCase tensors: an
// oracle independent of the library's gather / layout / GQA code.
ForwardResult naive_forward(const GdnCase& c) {
  const int64_t N = c.N(), K = c.K, V = c.V, G = c.HV / c.H;
  const double scale = std::isnan(c.scale) ? 1.0 / std::sqrt(double(K)) : c.scale;
  ForwardResult r;
  r.o.assign(static_cast<size_t>(c.B * c.T * c.HV * V), 0.0);
  r.ht.assign(static_cast<size_t>(N * c.HV * K * V), 0.0);
  auto state_index = [&](int64_t n, int64_t hv, int64_t i, int64_t j) {
    return c.state_v_first ? ((n * c.HV + hv) * V + j) * K + i : ((n * c.HV + hv) * K + i) * V + j;
  };
  for (int64_t n = 0; n < N; ++n) {
    const int64_t b = c.cu_seqlens.empty() ? n : 0;
    const int64_t t0 = c.cu_seqlens.empty() ? 0 : c.cu_seqlens[size_t(n)];
    const int64_t t1 = c.cu_seqlens.empty() ? c.T : c.cu_seqlens[size_t(n + 1)];
    for (int64_t hv = 0; hv < c.HV; ++hv) {
      const int64_t h = hv / G;
      std::vector<double> S(static_cast<size_t>(K * V), 0.0);
      if (c.with_h0)
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) S[size_t(i * V + j)] = c.h0.get_flat(state_index(n, hv, i, j));
      for (int64_t t = t0; t < t1; ++t) {
        std::vector<double> q(static_cast<size_t>(K)), k(static_cast<size_t>(K)), v(static_cast<size_t>(V)), vp(static_cast<size_t>(V));
        for (int64_t i = 0; i < K; ++i) {
          q[size_t(i)] = c.q.get_flat(((b * c.T + t) * c.H + h) * K + i);
          k[size_t(i)] = c.k.get_flat(((b * c.T + t) * c.H + h) * K + i);
        }
        if (c.l2norm) {
          double sq = 0, sk = 0;
          for (int64_t i = 0; i < K; ++i) {
            sq += q[size_t(i)] * q[size_t(i)];
            sk += k[size_t(i)] * k[size_t(i)];
          }
          for (int64_t i = 0; i < K; ++i) {
            q[size_t(i)] /= std::sqrt(sq + 1e-6);
            k[size_t(i)] /= std::sqrt(sk + 1e-6);
          }
        }
        for (int64_t j = 0; j < V; ++j) v[size_t(j)] = c.v.get_flat(((b * c.T + t) * c.HV + hv) * V + j);
        const double g = c.g.get_flat((b * c.T + t) * c.HV + hv);
        double beta = c.beta.get_flat((b * c.T + t) * c.HV + hv);
        if (c.beta_act == FLASHQLA_BETA_SIGMOID) beta = sigmoid(beta);
        if (c.beta_act == FLASHQLA_BETA_SIGMOID_X2) beta = 2.0 * sigmoid(beta);
        for (double& s : S) s *= std::exp(g);
        for (int64_t j = 0; j < V; ++j) {
          double p = 0;
          for (int64_t i = 0; i < K; ++i) p += S[size_t(i * V + j)] * k[size_t(i)];
          vp[size_t(j)] = beta * (v[size_t(j)] - p);
        }
        for (int64_t i = 0; i < K; ++i)
          for (int64_t j = 0; j < V; ++j) S[size_t(i * V + j)] += k[size_t(i)] * vp[size_t(j)];
        for (int64_t j = 0; j < V; ++j) {
          double o = 0;
          for (int64_t i = 0; i < K; ++i) o += S[size_t(i * V + j)] * q[size_t(i)];
          r.o[size_t(((b * c.T + t) * c.HV + hv) * V + j)] = scale * o;
        }
      }
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) r.ht[size_t(state_index(n, hv, i, j))] = S[size_t(i * V + j)];
    }
  }
  return r;
}

struct FwdConfig {
  std::string name;
  int64_t B = 1, T = 0, H = 1, HV = 1, K = 32, V = 32;
  std::vector<int64_t> cu_seqlens;
  bool h0 = true, v_first = false, l2norm = false, cu64 = false;
  double g_value = NAN, beta_value = NAN;
  flashqla_beta_activation_t beta_act = FLASHQLA_BETA_IDENTITY;
  int64_t row_pad = 0;
};

GdnCase make_case(const FwdConfig& f) {
  GdnCase c;
  c.B = f.B;
  c.T = f.T;
  c.H = f.H;
  c.HV = f.HV;
  c.K = f.K;
  c.V = f.V;
  c.cu_seqlens = f.cu_seqlens;
  c.cu_seqlens_int64 = f.cu64;
  c.with_h0 = f.h0;
  c.state_v_first = f.v_first;
  c.l2norm = f.l2norm;
  c.beta_act = f.beta_act;
  c.row_pad = f.row_pad;
  c.allocate_and_fill(0x5eed + f.T * 31 + f.K * 7 + f.HV, f.g_value, f.beta_value);
  return c;
}

class ChunkedVsRecurrent : public ::testing::TestWithParam<FwdConfig> {};

TEST_P(ChunkedVsRecurrent, Fp64) {
  GdnCase c = make_case(GetParam());
  const ForwardResult rec = run_forward(c, FLASHQLA_CPU_ALGORITHM_RECURRENT);
  const ForwardResult chk = run_forward(c, FLASHQLA_CPU_ALGORITHM_CHUNKED);
  EXPECT_LE(rel_error(chk.o, rec.o), kFp64Tol);
  EXPECT_LE(rel_error(chk.ht, rec.ht), kFp64Tol);
  // The recurrence itself against the definition written out above.
  const ForwardResult ref = naive_forward(c);
  EXPECT_LE(rel_error(rec.o, ref.o), 1e-13);
  EXPECT_LE(rel_error(rec.ht, ref.ht), 1e-13);
}

std::vector<FwdConfig> forward_configs() {
  std::vector<FwdConfig> v;
  for (int64_t T : {0, 1, 63, 64, 65, 127, 1000}) {
    FwdConfig f;
    f.name = "len" + std::to_string(T);
    f.B = 2;
    f.T = T;
    f.H = 1;
    f.HV = 2;
    v.push_back(f);
  }
  {
    FwdConfig f;
    f.name = "varlen_with_empty";
    f.cu_seqlens = {0, 0, 1, 64, 64, 129, 200, 200};
    f.T = 200;
    f.H = 2;
    f.HV = 4;
    v.push_back(f);
    f.name = "varlen_int64_no_h0";
    f.cu64 = true;
    f.h0 = false;
    v.push_back(f);
  }
  {
    FwdConfig f;
    f.name = "varlen_many_tiny";
    f.cu_seqlens = {0};
    for (int i = 1; i <= 40; ++i) f.cu_seqlens.push_back(f.cu_seqlens.back() + (i % 5));
    f.T = f.cu_seqlens.back();
    f.H = 1;
    f.HV = 1;
    v.push_back(f);
  }
  for (int64_t ratio : {1, 2, 3, 4, 8}) {
    FwdConfig f;
    f.name = "gqa" + std::to_string(ratio);
    f.B = 1;
    f.T = 130;
    f.H = 2;
    f.HV = 2 * ratio;
    f.K = 16;
    f.V = 24;
    v.push_back(f);
  }
  for (int64_t d : {32, 64, 100, 128, 256}) {
    FwdConfig f;
    f.name = "K" + std::to_string(d);
    f.T = 150;
    f.K = d;
    f.V = 48;
    v.push_back(f);
    f.name = "V" + std::to_string(d);
    f.K = 48;
    f.V = d;
    v.push_back(f);
  }
  {
    FwdConfig f;
    f.name = "K256_V256_len1000";
    f.T = 1000;
    f.K = 256;
    f.V = 256;
    v.push_back(f);
  }
  {
    FwdConfig f;
    f.T = 200;
    f.HV = 2;
    append_gate_and_beta_edge_cases(v, f);
    f.name = "no_h0";
    f.h0 = false;
    v.push_back(f);
    f.h0 = true;
    f.name = "state_v_first";
    f.v_first = true;
    f.K = 16;
    f.V = 40;
    v.push_back(f);
    f.v_first = false;
    f.name = "l2norm_in_op";
    f.l2norm = true;
    v.push_back(f);
    f.l2norm = false;
    f.name = "beta_sigmoid";
    f.beta_act = FLASHQLA_BETA_SIGMOID;
    v.push_back(f);
    f.name = "beta_sigmoid_x2";
    f.beta_act = FLASHQLA_BETA_SIGMOID_X2;
    v.push_back(f);
    f.beta_act = FLASHQLA_BETA_IDENTITY;
    f.name = "strided_views";
    f.row_pad = 5;
    f.H = 2;
    f.HV = 6;
    v.push_back(f);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cpu, ChunkedVsRecurrent, ::testing::ValuesIn(forward_configs()),
                         [](const auto& info) { return info.param.name; });

// Low-precision inputs and outputs: both algorithms accumulate in fp64 on the
// same rounded inputs, so they differ only by the final rounding of o / ht.
TEST(CpuForward, LowPrecisionDtypesAgree) {
  for (flashqla_dtype_t dtype : {FLASHQLA_DTYPE_BFLOAT16, FLASHQLA_DTYPE_FLOAT16, FLASHQLA_DTYPE_FLOAT32}) {
    GdnCase c;
    c.cu_seqlens = {0, 70, 70, 200};
    c.H = 2;
    c.HV = 4;
    c.K = 32;
    c.V = 32;
    c.with_h0 = true;
    c.dtype = dtype;
    c.gate_dtype = FLASHQLA_DTYPE_FLOAT32;
    c.state_dtype = FLASHQLA_DTYPE_FLOAT32;
    c.allocate_and_fill(17);
    const ForwardResult rec = run_forward(c, FLASHQLA_CPU_ALGORITHM_RECURRENT);
    const ForwardResult chk = run_forward(c, FLASHQLA_CPU_ALGORITHM_CHUNKED);
    const ForwardResult ref = naive_forward(c);
    const double tol = dtype == FLASHQLA_DTYPE_FLOAT32 ? 1e-6 : 1e-2;
    EXPECT_LE(rel_error(chk.o, rec.o), tol) << int(dtype);
    EXPECT_LE(rel_error(chk.ht, rec.ht), 1e-6) << int(dtype);  // fp32 state
    EXPECT_LE(rel_error(rec.o, ref.o), tol) << int(dtype);
  }
}

// A hand-computed case: K = V = 1, two tokens.
TEST(CpuForward, HandComputedScalarRecurrence) {
  for (auto algo : {FLASHQLA_CPU_ALGORITHM_RECURRENT, FLASHQLA_CPU_ALGORITHM_CHUNKED}) {
    GdnCase c;
    c.T = 2;
    c.K = 1;
    c.V = 1;
    c.with_h0 = true;
    c.scale = 0.5;
    c.allocate_and_fill(1);
    const double q[] = {2.0, -1.0}, k[] = {1.0, 1.0}, v[] = {3.0, 1.0}, g[] = {std::log(0.5), 0.0},
                 beta[] = {0.5, 1.0};
    for (int t = 0; t < 2; ++t) {
      c.q.set_flat(t, q[t]);
      c.k.set_flat(t, k[t]);
      c.v.set_flat(t, v[t]);
      c.g.set_flat(t, g[t]);
      c.beta.set_flat(t, beta[t]);
    }
    c.h0.set_flat(0, 4.0);
    // t=0: S = 2; v' = 0.5 (3 − 2) = 0.5; S = 2.5; o = 0.5·2.5·2 = 2.5
    // t=1: S = 2.5; v' = 1 (1 − 2.5) = −1.5; S = 1; o = 0.5·1·(−1) = −0.5
    const ForwardResult r = run_forward(c, algo);
    EXPECT_DOUBLE_EQ(r.o[0], 2.5);
    EXPECT_DOUBLE_EQ(r.o[1], -0.5);
    EXPECT_DOUBLE_EQ(r.ht[0], 1.0);
  }
}

// Threads do not change results: the same call on 1 and on 3 threads is
// bitwise identical.
TEST(CpuForward, DeterministicAcrossThreadCounts) {
  GdnCase c;
  c.cu_seqlens = {0, 100, 101, 300};
  c.H = 2;
  c.HV = 6;
  c.K = 24;
  c.V = 16;
  c.with_h0 = true;
  c.allocate_and_fill(5);
  std::vector<double> first;
  for (int threads : {1, 3}) {
    c.poison_outputs();
    flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
    p.cpu_num_threads = threads;
    ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
    if (first.empty()) {
      first = c.o.to_vector();
    } else {
      EXPECT_EQ(first, c.o.to_vector());
    }
  }
}

// The host copy of cu_seqlens is honoured and checked like the tensor itself.
TEST(CpuForward, CuSeqlensHostCopyGivesSameResult) {
  GdnCase c;
  c.cu_seqlens = {0, 10, 80};
  c.HV = 2;
  c.allocate_and_fill(9);
  const ForwardResult plain = run_forward(c, FLASHQLA_CPU_ALGORITHM_CHUNKED);
  c.poison_outputs();
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  p.cu_seqlens_host = c.cu.desc.data;
  ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_EQ(plain.o, c.o.to_vector());
  // A host copy that disagrees with the tensor the CPU reads is an error.
  std::vector<int32_t> other = {0, 11, 80};
  p.cu_seqlens_host = other.data();
  EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashqla_last_error_message()).find("cu_seqlens_host: differs from cu_seqlens at index 1"),
            std::string::npos)
      << flashqla_last_error_message();
}

// An empty batch needs no token tensors at all (untouched descriptors), and
// the final state is the initial state.
TEST(CpuForward, EmptyBatchPassesStateThrough) {
  HostTensor h0({2, 1, 3, 4}, FLASHQLA_DTYPE_FLOAT32), ht({2, 1, 3, 4}, FLASHQLA_DTYPE_FLOAT32);
  for (int64_t i = 0; i < h0.numel(); ++i) h0.set_flat(i, 0.25 * double(i) - 1.0);
  ht.fill_nan();
  flashqla_gdn_fwd_params_t p;
  flashqla_gdn_fwd_params_init(&p);
  p.B = 2;
  p.T = 0;
  p.H = 1;
  p.HV = 1;
  p.K = 3;
  p.V = 4;
  p.initial_state = h0.desc;
  p.initial_state_n = 2;
  p.final_state = ht.desc;
  p.output_final_state = 1;
  p.backend = FLASHQLA_BACKEND_CPU;
  ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_EQ(ht.to_vector(), h0.to_vector());
}

}  // namespace
}  // namespace flashqla_test
