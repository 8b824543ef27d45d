// State checkpoints (checkpoint_chunks = e): each sequence's state after every
// 64 e tokens, at the rows the C API documents, equal to the final state of
// the plain forward over that many tokens of the sequence (CPU, fp64); the
// argument checks. The CUDA backend refuses checkpoints so far (NOT_SUPPORTED).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "test_support.h"

namespace flashqla_test {
namespace {

// A varlen case whose sequence n holds the first keep[n] tokens of c's
// sequence n (same heads, options and h0).
GdnCase truncated(const GdnCase& c, const std::vector<int64_t>& keep) {
  GdnCase t = c;
  t.B = 1;
  t.cu_seqlens = {0};
  for (int64_t n : keep) t.cu_seqlens.push_back(t.cu_seqlens.back() + n);
  t.T = t.cu_seqlens.back();
  t.allocate_and_fill(1);  // shapes; the inputs are copied below
  if (c.with_h0) t.h0 = c.h0;
  auto bos = [&](const GdnCase& x, int64_t n) { return x.cu_seqlens.empty() ? n * x.T : x.cu_seqlens[size_t(n)]; };
  for (size_t n = 0; n < keep.size(); ++n) {
    for (int64_t j = 0; j < keep[n]; ++j) {
      const int64_t from = bos(c, int64_t(n)) + j, to = t.cu_seqlens[n] + j;
      const struct {
        const HostTensor& src;
        HostTensor& dst;
        int64_t width;
      } rows[] = {{c.q, t.q, c.H * c.K}, {c.k, t.k, c.H * c.K}, {c.v, t.v, c.HV * c.V},
                  {c.g, t.g, c.HV},      {c.beta, t.beta, c.HV}};
      for (const auto& r : rows)
        for (int64_t i = 0; i < r.width; ++i) r.dst.set_flat(to * r.width + i, r.src.get_flat(from * r.width + i));
    }
  }
  return t;
}

struct CheckpointCase {
  std::string name;
  std::vector<int64_t> cu_seqlens;  // empty: B rows of T tokens
  int64_t B, T, every;
  bool v_first, with_h0;
};

class Checkpoints : public ::testing::TestWithParam<CheckpointCase> {};

TEST_P(Checkpoints, EqualThePlainForwardOverTheirTokens) {
  const CheckpointCase& k = GetParam();
  GdnCase c;
  c.B = k.cu_seqlens.empty() ? k.B : 1;
  c.T = k.cu_seqlens.empty() ? k.T : k.cu_seqlens.back();
  c.cu_seqlens = k.cu_seqlens;
  c.H = 2, c.HV = 4, c.K = 12, c.V = 10;
  c.state_v_first = k.v_first;
  c.with_h0 = k.with_h0;
  c.allocate_and_fill(7);
  const int64_t N = c.N(), tokens = 64 * k.every, rows = c.B * c.T / tokens;
  std::vector<int64_t> len(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) len[size_t(n)] = c.cu_seqlens.empty() ? c.T : c.cu_seqlens[n + 1] - c.cu_seqlens[n];
  const std::vector<int64_t> row_shape = k.v_first ? std::vector<int64_t>{c.HV, c.V, c.K}
                                                   : std::vector<int64_t>{c.HV, c.K, c.V};
  HostTensor ckpt({rows + 1, row_shape[0], row_shape[1], row_shape[2]}, FLASHQLA_DTYPE_FLOAT64);
  ckpt.fill_nan();
  GdnCase plain = c;
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  p.checkpoints = ckpt.desc;
  p.checkpoints_n = rows + 1;
  p.checkpoint_chunks = k.every;
  ASSERT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  // o and the final state as without checkpoints.
  flashqla_gdn_fwd_params_t pp = plain.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  ASSERT_EQ(flashqla_gdn_fwd(&pp), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
  EXPECT_LE(rel_error(c.o.to_vector(), plain.o.to_vector()), 1e-12);
  EXPECT_LE(rel_error(c.ht.to_vector(), plain.ht.to_vector()), 1e-12);
  // Checkpoint j of sequence n: the final state over its first 64 e j tokens.
  const int64_t per_row = c.HV * c.K * c.V;
  int64_t row = 0, written = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 1; j <= len[size_t(n)] / tokens; ++j, ++row, ++written) {
      std::vector<int64_t> keep(static_cast<size_t>(N), 0);
      keep[size_t(n)] = j * tokens;
      GdnCase t = truncated(c, keep);
      flashqla_gdn_fwd_params_t tp = t.fwd_params(FLASHQLA_CPU_ALGORITHM_RECURRENT);
      ASSERT_EQ(flashqla_gdn_fwd(&tp), FLASHQLA_STATUS_SUCCESS) << flashqla_last_error_message();
      std::vector<double> got(static_cast<size_t>(per_row)), want(static_cast<size_t>(per_row));
      for (int64_t i = 0; i < per_row; ++i) {
        got[size_t(i)] = ckpt.get_flat(row * per_row + i);
        want[size_t(i)] = t.ht.get_flat(n * per_row + i);
      }
      EXPECT_LE(rel_error(got, want), 1e-10) << k.name << ": sequence " << n << ", checkpoint " << j;
    }
  }
  // Rows past the written ones are not touched.
  for (int64_t i = written * per_row; i < ckpt.numel(); ++i) ASSERT_TRUE(std::isnan(ckpt.get_flat(i))) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, Checkpoints,
    ::testing::Values(CheckpointCase{"varlen_every_chunk", {0, 130, 130, 430, 494, 500}, 0, 0, 1, false, true},
                      CheckpointCase{"varlen_every_2_vfirst", {0, 300, 301, 600}, 0, 0, 2, true, false},
                      CheckpointCase{"batch_every_chunk", {}, 3, 200, 1, false, true},
                      CheckpointCase{"shorter_than_interval", {0, 50, 90}, 0, 0, 1, false, true}),
    [](const auto& info) { return info.param.name; });

TEST(CheckpointsValidation, RefusesByName) {
  GdnCase c;
  c.B = 1, c.T = 300, c.K = c.V = 8;
  c.allocate_and_fill(3);
  HostTensor ckpt({4, 1, 8, 8}, FLASHQLA_DTYPE_FLOAT32);
  auto expect = [](flashqla_gdn_fwd_params_t p, const std::string& needle) {
    EXPECT_EQ(flashqla_gdn_fwd(&p), FLASHQLA_STATUS_INVALID_ARGUMENT) << needle;
    EXPECT_NE(std::string(flashqla_last_error_message()).find(needle), std::string::npos)
        << flashqla_last_error_message();
  };
  flashqla_gdn_fwd_params_t p = c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  p.checkpoint_chunks = 1;
  p.checkpoints = ckpt.desc;
  p.checkpoints_n = 3;  // floor(300 / 64) = 4 needed
  expect(p, "checkpoints_n: must be at least floor(B T / (64 checkpoint_chunks)) = 4");
  p.checkpoints_n = 4;
  p.checkpoint_chunks = -1;
  expect(p, "checkpoint_chunks: must be >= 0");
  p.checkpoint_chunks = 0;
  expect(p, "checkpoints: given without checkpoint_chunks");
  p.checkpoint_chunks = 1;
  p.checkpoints = flashqla_tensor_t{};
  expect(p, "checkpoints: pointer is NULL");
}

}  // namespace
}  // namespace flashqla_test
