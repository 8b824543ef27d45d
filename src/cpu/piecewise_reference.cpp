#include "cpu/piecewise_reference.h"

#include <algorithm>

#include "cpu/chunked_reference.h"

namespace flashqla::cpu {
namespace {

// The inputs of tokens [t0, t1) of a head, starting from h0.
HeadInputs piece_inputs(const HeadInputs& in, int64_t t0, int64_t t1, const double* h0) {
  HeadInputs p = in;
  p.T = t1 - t0;
  p.q = in.q + t0 * in.K;
  p.k = in.k + t0 * in.K;
  p.v = in.v + t0 * in.V;
  p.g = in.g + t0;
  p.beta = in.beta + t0;
  p.h0 = h0;
  return p;
}

// y (rows×cols) = a (rows×n) b (n×cols), or aᵀ b with a n×rows.
void matmul(const double* a, const double* b, int64_t rows, int64_t n, int64_t cols, bool transpose_a, double* y) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double s = 0.0;
      for (int64_t x = 0; x < n; ++x) s += (transpose_a ? a[x * rows + i] : a[i * n + x]) * b[x * cols + j];
      y[i * cols + j] = s;
    }
}

}  // namespace

std::vector<int64_t> piece_bounds(int64_t T, int64_t piece_tokens) {
  std::vector<int64_t> bounds{0};
  const int64_t step = std::max<int64_t>(piece_tokens, 1);
  for (int64_t t = step; t < T; t += step) bounds.push_back(t);
  bounds.push_back(std::max<int64_t>(T, 0));
  return bounds;
}

PieceTransitions piece_transitions(const HeadInputs& in, const std::vector<int64_t>& bounds) {
  const int64_t K = in.K, V = in.V, pieces = int64_t(bounds.size()) - 1;
  PieceTransitions tr;
  tr.m.resize(size_t(pieces));
  tr.s_local.resize(size_t(pieces));
  std::vector<double> identity(size_t(K * K), 0.0);
  for (int64_t x = 0; x < K; ++x) identity[size_t(x * K + x)] = 1.0;
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t t0 = bounds[size_t(p)], t1 = bounds[size_t(p + 1)], L = t1 - t0;
    // S_local: from zero, with v.
    std::vector<double> o(size_t(std::max<int64_t>(L, 1) * V));
    tr.s_local[size_t(p)].assign(size_t(K * V), 0.0);
    chunked_forward(piece_inputs(in, t0, t1, nullptr), {o.data(), tr.s_local[size_t(p)].data()});
    // M: from the identity (K value columns), with v = 0.
    HeadInputs m_in = piece_inputs(in, t0, t1, identity.data());
    std::vector<double> zero_v(size_t(std::max<int64_t>(L, 1) * K), 0.0), om(zero_v.size());
    m_in.V = K;
    m_in.v = zero_v.data();
    tr.m[size_t(p)].assign(size_t(K * K), 0.0);
    chunked_forward(m_in, {om.data(), tr.m[size_t(p)].data()});
  }
  return tr;
}

std::vector<std::vector<double>> piece_start_states(const PieceTransitions& tr, const double* h0, int64_t K,
                                                    int64_t V) {
  const size_t pieces = tr.m.size();
  std::vector<std::vector<double>> start(pieces + 1, std::vector<double>(size_t(K * V), 0.0));
  if (h0 != nullptr) std::copy(h0, h0 + K * V, start[0].begin());
  for (size_t p = 0; p < pieces; ++p) {
    matmul(tr.m[p].data(), start[p].data(), K, K, V, false, start[p + 1].data());
    for (int64_t i = 0; i < K * V; ++i) start[p + 1][size_t(i)] += tr.s_local[p][size_t(i)];
  }
  return start;
}

void piecewise_forward(const HeadInputs& in, const HeadOutputs& out, int64_t piece_tokens) {
  const std::vector<int64_t> bounds = piece_bounds(in.T, piece_tokens);
  const auto start = piece_start_states(piece_transitions(in, bounds), in.h0, in.K, in.V);
  const int64_t pieces = int64_t(bounds.size()) - 1;
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t t0 = bounds[size_t(p)], t1 = bounds[size_t(p + 1)];
    std::vector<double> end(size_t(in.K * in.V));
    chunked_forward(piece_inputs(in, t0, t1, start[size_t(p)].data()), {out.o + t0 * in.V, end.data()});
  }
  if (out.ht != nullptr) std::copy(start.back().begin(), start.back().end(), out.ht);
}

void piecewise_backward(const HeadInputs& in, const HeadGradInputs& gin, const HeadGrads& grads,
                        int64_t piece_tokens) {
  const int64_t K = in.K, V = in.V;
  const std::vector<int64_t> bounds = piece_bounds(in.T, piece_tokens);
  const int64_t pieces = int64_t(bounds.size()) - 1;
  const PieceTransitions tr = piece_transitions(in, bounds);
  const auto start = piece_start_states(tr, in.h0, K, V);
  auto piece_grads = [&](int64_t p, double* dh0) {
    const int64_t t0 = bounds[size_t(p)];
    return HeadGrads{grads.dq + t0 * K, grads.dk + t0 * K, grads.dv + t0 * V, grads.dg + t0, grads.dbeta + t0, dh0};
  };
  // dS_local(p): each piece's dh0 with dht = 0 (independent of the start state;
  // its token gradients are overwritten by the rerun below).
  std::vector<std::vector<double>> ds_local(size_t(pieces), std::vector<double>(size_t(K * V)));
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t t0 = bounds[size_t(p)], t1 = bounds[size_t(p + 1)];
    chunked_backward(piece_inputs(in, t0, t1, start[size_t(p)].data()), {gin.d_o + t0 * V, nullptr},
                     piece_grads(p, ds_local[size_t(p)].data()));
  }
  // The dS scan from the last piece back: dS_end(last) = dht,
  // dS_end(p − 1) = dS_start(p) = M_pᵀ dS_end(p) + dS_local(p).
  std::vector<std::vector<double>> ds_end(size_t(pieces), std::vector<double>(size_t(K * V), 0.0));
  if (gin.dht != nullptr) std::copy(gin.dht, gin.dht + K * V, ds_end[size_t(pieces - 1)].begin());
  std::vector<double> ds_start(size_t(K * V));
  for (int64_t p = pieces - 1; p >= 0; --p) {
    matmul(tr.m[size_t(p)].data(), ds_end[size_t(p)].data(), K, K, V, true, ds_start.data());
    for (int64_t i = 0; i < K * V; ++i) ds_start[size_t(i)] += ds_local[size_t(p)][size_t(i)];
    if (p > 0) ds_end[size_t(p - 1)] = ds_start;
  }
  if (grads.dh0 != nullptr) std::copy(ds_start.begin(), ds_start.end(), grads.dh0);
  // Every piece again from its true start state with its true dS_end.
  std::vector<double> dh0_piece(size_t(K * V));
  for (int64_t p = 0; p < pieces; ++p) {
    const int64_t t0 = bounds[size_t(p)], t1 = bounds[size_t(p + 1)];
    chunked_backward(piece_inputs(in, t0, t1, start[size_t(p)].data()), {gin.d_o + t0 * V, ds_end[size_t(p)].data()},
                     piece_grads(p, dh0_piece.data()));
  }
}

}  // namespace flashqla::cpu
