// The forward and backward by sequence pieces (src/cpu/piecewise_reference.h)
// against the chunked algorithm over the whole sequence, in fp64: the algebra of
// intra-card sequence parallelism (forward scan S_end = M S_start + S_local,
// backward scan dS_start = Mᵀ dS_end + dS_local) is exact, for any piece length,
// with and without h0 and dht. Outputs are poisoned with NaN first.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/chunked_reference.h"
#include "cpu/piecewise_reference.h"

namespace flashqla_test {
namespace {

using flashqla::cpu::HeadGradInputs;
using flashqla::cpu::HeadGrads;
using flashqla::cpu::HeadInputs;
using flashqla::cpu::HeadOutputs;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Head {
  int64_t T, K, V;
  std::vector<double> q, k, v, g, beta, h0, d_o, dht;
};

Head random_head(int64_t T, int64_t K, int64_t V, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Head h{T, K, V, {}, {}, {}, {}, {}, {}, {}, {}};
  auto fill = [&](std::vector<double>& x, int64_t count, double scale) {
    x.resize(size_t(count));
    for (auto& e : x) e = scale * n(rng);
  };
  fill(h.q, T * K, 1.0 / std::sqrt(double(K)));
  fill(h.k, T * K, 1.0 / std::sqrt(double(K)));
  fill(h.v, T * V, 1.0);
  h.g.resize(size_t(T));
  for (auto& e : h.g) e = -0.3 * u(rng);  // log decays in (−0.3, 0]
  h.beta.resize(size_t(T));
  for (auto& e : h.beta) e = u(rng);
  fill(h.h0, K * V, 0.5);
  fill(h.d_o, T * V, 1.0);
  fill(h.dht, K * V, 0.5);
  return h;
}

HeadInputs inputs(const Head& h, bool with_h0) {
  HeadInputs in;
  in.T = h.T, in.K = h.K, in.V = h.V;
  in.q = h.q.data(), in.k = h.k.data(), in.v = h.v.data(), in.g = h.g.data(), in.beta = h.beta.data();
  in.h0 = with_h0 ? h.h0.data() : nullptr;
  in.scale = 1.0 / std::sqrt(double(h.K));
  return in;
}

// Largest |a − b| over the largest |b| (0 when both are empty); NaN anywhere: infinity.
double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    num = std::max(num, std::fabs(a[i] - b[i]));
    den = std::max(den, std::fabs(b[i]));
  }
  return den > 0.0 ? num / den : num;
}

struct Forward {
  std::vector<double> o, ht;
};

Forward forward(const Head& h, bool with_h0, int64_t piece_tokens) {
  Forward f{std::vector<double>(size_t(std::max<int64_t>(h.T * h.V, 1)), kNaN),
            std::vector<double>(size_t(h.K * h.V), kNaN)};
  const HeadInputs in = inputs(h, with_h0);
  if (piece_tokens > 0) {
    flashqla::cpu::piecewise_forward(in, {f.o.data(), f.ht.data()}, piece_tokens);
  } else {
    flashqla::cpu::chunked_forward(in, {f.o.data(), f.ht.data()});
  }
  f.o.resize(size_t(h.T * h.V));
  return f;
}

struct Backward {
  std::vector<double> dq, dk, dv, dg, dbeta, dh0;
};

Backward backward(const Head& h, bool with_h0, bool with_dht, int64_t piece_tokens) {
  const size_t tk = size_t(std::max<int64_t>(h.T * h.K, 1)), tv = size_t(std::max<int64_t>(h.T * h.V, 1)),
               t = size_t(std::max<int64_t>(h.T, 1));
  Backward b{std::vector<double>(tk, kNaN), std::vector<double>(tk, kNaN), std::vector<double>(tv, kNaN),
             std::vector<double>(t, kNaN),  std::vector<double>(t, kNaN),  std::vector<double>(size_t(h.K * h.V), kNaN)};
  const HeadInputs in = inputs(h, with_h0);
  const HeadGradInputs gin{h.d_o.data(), with_dht ? h.dht.data() : nullptr};
  const HeadGrads grads{b.dq.data(), b.dk.data(), b.dv.data(), b.dg.data(), b.dbeta.data(), b.dh0.data()};
  if (piece_tokens > 0) {
    flashqla::cpu::piecewise_backward(in, gin, grads, piece_tokens);
  } else {
    flashqla::cpu::chunked_backward(in, gin, grads);
  }
  b.dq.resize(size_t(h.T * h.K)), b.dk.resize(size_t(h.T * h.K)), b.dv.resize(size_t(h.T * h.V));
  b.dg.resize(size_t(h.T)), b.dbeta.resize(size_t(h.T));
  return b;
}

struct PieceCase {
  int64_t T, K, V, piece_tokens;
  bool h0, dht;
};

std::string case_name(const ::testing::TestParamInfo<PieceCase>& info) {
  const PieceCase& c = info.param;
  return "T" + std::to_string(c.T) + "_K" + std::to_string(c.K) + "_V" + std::to_string(c.V) + "_piece" +
         std::to_string(c.piece_tokens) + (c.h0 ? "_h0" : "") + (c.dht ? "_dht" : "");
}

class PiecewiseReference : public ::testing::TestWithParam<PieceCase> {};

TEST_P(PiecewiseReference, ForwardEqualsWholeSequence) {
  const PieceCase& c = GetParam();
  const Head h = random_head(c.T, c.K, c.V, 0x91ece + uint64_t(c.T * 131 + c.piece_tokens));
  const Forward whole = forward(h, c.h0, 0), pieces = forward(h, c.h0, c.piece_tokens);
  EXPECT_LE(rel_error(pieces.o, whole.o), 1e-10) << "o";
  EXPECT_LE(rel_error(pieces.ht, whole.ht), 1e-10) << "final state";
}

TEST_P(PiecewiseReference, BackwardEqualsWholeSequence) {
  const PieceCase& c = GetParam();
  const Head h = random_head(c.T, c.K, c.V, 0xb1ece + uint64_t(c.T * 131 + c.piece_tokens));
  const Backward whole = backward(h, c.h0, c.dht, 0), pieces = backward(h, c.h0, c.dht, c.piece_tokens);
  EXPECT_LE(rel_error(pieces.dq, whole.dq), 1e-10) << "dq";
  EXPECT_LE(rel_error(pieces.dk, whole.dk), 1e-10) << "dk";
  EXPECT_LE(rel_error(pieces.dv, whole.dv), 1e-10) << "dv";
  EXPECT_LE(rel_error(pieces.dg, whole.dg), 1e-10) << "dg";
  EXPECT_LE(rel_error(pieces.dbeta, whole.dbeta), 1e-10) << "dbeta";
  EXPECT_LE(rel_error(pieces.dh0, whole.dh0), 1e-10) << "dh0";
}

std::vector<PieceCase> piece_cases() {
  std::vector<PieceCase> v;
  for (int64_t T : {0, 1, 65, 200})
    for (int64_t piece : {1, 17, 64, 100, 1000}) v.push_back({T, 8, 12, piece, true, true});
  for (bool h0 : {false, true})
    for (bool dht : {false, true}) v.push_back({333, 16, 16, 64, h0, dht});
  v.push_back({257, 12, 8, 50, true, true});  // V < K
  return v;
}

INSTANTIATE_TEST_SUITE_P(Fp64, PiecewiseReference, ::testing::ValuesIn(piece_cases()), case_name);

TEST(PiecewiseReference, PieceBoundsCoverTheSequence) {
  using flashqla::cpu::piece_bounds;
  EXPECT_EQ(piece_bounds(0, 64), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(piece_bounds(64, 64), (std::vector<int64_t>{0, 64}));
  EXPECT_EQ(piece_bounds(65, 64), (std::vector<int64_t>{0, 64, 65}));
  EXPECT_EQ(piece_bounds(200, 100), (std::vector<int64_t>{0, 100, 200}));
}

// The scan's ingredients on their own: a piece's end state from a given start is
// M S_start + S_local, with M and S_local from zero and identity starts.
TEST(PiecewiseReference, EndStateIsAffineInTheStartState) {
  const Head h = random_head(150, 8, 12, 0xaff1e);
  const HeadInputs in = inputs(h, true);
  const std::vector<int64_t> one_piece{0, h.T};
  const auto tr = flashqla::cpu::piece_transitions(in, one_piece);
  const auto scanned = flashqla::cpu::piece_start_states(tr, h.h0.data(), h.K, h.V);
  const Forward direct = forward(h, true, 0);
  EXPECT_LE(rel_error(scanned.back(), direct.ht), 1e-12);
}

}  // namespace
}  // namespace flashqla_test
