#include "cpu/cpu_backend.h"

#include <algorithm>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/sequences.h"
#include "cpu/chunked_reference.h"
#include "cpu/head_problem.h"
#include "cpu/parallel_for.h"
#include "cpu/recurrent_reference.h"

namespace flashqla::cpu {
namespace {

constexpr double kL2NormEps = 1e-6;

SequenceSpan sequence_span(const Problem& pr, int64_t n) {
  if (pr.varlen) return {0, pr.cu_seqlens_host[size_t(n)], pr.cu_seqlens_host[size_t(n + 1)]};
  return {n, 0, pr.T};
}

// Rows [span) of head h of a [B,T,heads,D] tensor as a dense [L, D] array.
void gather_rows(const flashqla_tensor_t& x, const SequenceSpan& s, int64_t h, int64_t D,
                 double* out) {
  for (int64_t t = 0; t < s.length(); ++t)
    for (int64_t i = 0; i < D; ++i)
      out[t * D + i] = load_as_double(x.data, x.dtype, offset4(x, s.batch_row, s.begin + t, h, i));
}

void scatter_rows(const flashqla_tensor_t& x, const SequenceSpan& s, int64_t h, int64_t D,
                  const double* in) {
  for (int64_t t = 0; t < s.length(); ++t)
    for (int64_t i = 0; i < D; ++i)
      store_from_double(x.data, x.dtype, offset4(x, s.batch_row, s.begin + t, h, i), in[t * D + i]);
}

void gather_scalars(const flashqla_tensor_t& x, const SequenceSpan& s, int64_t h, double* out) {
  for (int64_t t = 0; t < s.length(); ++t)
    out[t] = load_as_double(x.data, x.dtype, offset3(x, s.batch_row, s.begin + t, h));
}

void scatter_scalars(const flashqla_tensor_t& x, const SequenceSpan& s, int64_t h, const double* in) {
  for (int64_t t = 0; t < s.length(); ++t)
    store_from_double(x.data, x.dtype, offset3(x, s.batch_row, s.begin + t, h), in[t]);
}

// State [n, hv] as a dense K×V array, whatever the layout.
int64_t state_offset(const flashqla_tensor_t& x, bool v_first, int64_t n, int64_t hv, int64_t i,
                     int64_t j) {
  const int64_t base = n * x.stride[0] + hv * x.stride[1];
  return v_first ? base + j * x.stride[2] + i * x.stride[3] : base + i * x.stride[2] + j * x.stride[3];
}

void gather_state(const flashqla_tensor_t& x, bool v_first, int64_t n, int64_t hv, int64_t K,
                  int64_t V, double* out) {
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < V; ++j)
      out[i * V + j] = load_as_double(x.data, x.dtype, state_offset(x, v_first, n, hv, i, j));
}

void scatter_state(const flashqla_tensor_t& x, bool v_first, int64_t n, int64_t hv, int64_t K,
                   int64_t V, const double* in) {
  for (int64_t i = 0; i < K; ++i)
    for (int64_t j = 0; j < V; ++j)
      store_from_double(x.data, x.dtype, state_offset(x, v_first, n, hv, i, j), in[i * V + j]);
}

// In place: each D-row becomes x · rsqrt(Σx² + eps); rinv[t] keeps the rsqrt.
void l2norm_rows(double* x, int64_t L, int64_t D, double* rinv) {
  for (int64_t t = 0; t < L; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += x[t * D + i] * x[t * D + i];
    const double r = 1.0 / std::sqrt(ss + kL2NormEps);
    rinv[t] = r;
    for (int64_t i = 0; i < D; ++i) x[t * D + i] *= r;
  }
}

// Gradient through y = x · r(x), given y (normalised rows), r and dy:
// dx = r (dy − y (y·dy)). Overwrites dy with dx.
void l2norm_rows_backward(const double* y, const double* rinv, int64_t L, int64_t D, double* dy) {
  for (int64_t t = 0; t < L; ++t) {
    double yd = 0.0;
    for (int64_t i = 0; i < D; ++i) yd += y[t * D + i] * dy[t * D + i];
    for (int64_t i = 0; i < D; ++i) dy[t * D + i] = rinv[t] * (dy[t * D + i] - y[t * D + i] * yd);
  }
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The per-token beta the recurrence uses, and d(beta)/d(raw beta).
void activate_beta(flashqla_beta_activation_t act, const double* raw, int64_t L, double* beta,
                   double* dbeta_draw) {
  for (int64_t t = 0; t < L; ++t) {
    if (act == FLASHQLA_BETA_IDENTITY) {
      beta[t] = raw[t];
      dbeta_draw[t] = 1.0;
    } else {
      const double s = sigmoid(raw[t]);
      const double mult = act == FLASHQLA_BETA_SIGMOID_X2 ? 2.0 : 1.0;
      beta[t] = mult * s;
      dbeta_draw[t] = mult * s * sigmoid(-raw[t]);  // not s (1 − s): 1 − s rounds to 0 for raw ≳ 37
    }
  }
}

// The dense inputs of one (sequence, value head); q/k are shared by the
// value heads of a group and loaded by the caller.
struct HeadBuffers {
  std::vector<double> v, g, beta, dbeta_draw, h0;
  bool has_h0 = false;
  // `state` is the initial state's row: the sequence n, or its pool slot
  // (negative: none, the sequence starts from zero).
  void load(const Problem& pr, const flashqla_gdn_fwd_params_t& p, const SequenceSpan& s,
            int64_t state, int64_t hv) {
    const int64_t L = s.length();
    v.resize(static_cast<size_t>(L * pr.V));
    g.resize(static_cast<size_t>(L));
    beta.resize(static_cast<size_t>(L));
    dbeta_draw.resize(static_cast<size_t>(L));
    gather_rows(p.v, s, hv, pr.V, v.data());
    gather_scalars(p.g, s, hv, g.data());
    std::vector<double> raw(static_cast<size_t>(L));
    gather_scalars(p.beta, s, hv, raw.data());
    activate_beta(p.beta_activation, raw.data(), L, beta.data(), dbeta_draw.data());
    has_h0 = pr.has_initial_state && state >= 0;
    if (has_h0) {
      h0.resize(static_cast<size_t>(pr.K * pr.V));
      gather_state(p.initial_state, p.state_v_first != 0, state, hv, pr.K, pr.V, h0.data());
    }
  }
};

// q and k of one (sequence, q/k head), normalised when requested.
struct QKBuffers {
  std::vector<double> q, k, q_rinv, k_rinv;
  void load(const Problem& pr, const flashqla_gdn_fwd_params_t& p, const SequenceSpan& s,
            int64_t h) {
    const int64_t L = s.length();
    q.resize(static_cast<size_t>(L * pr.K));
    k.resize(static_cast<size_t>(L * pr.K));
    gather_rows(p.q, s, h, pr.K, q.data());
    gather_rows(p.k, s, h, pr.K, k.data());
    if (p.use_qk_l2norm) {
      q_rinv.resize(static_cast<size_t>(L));
      k_rinv.resize(static_cast<size_t>(L));
      l2norm_rows(q.data(), L, pr.K, q_rinv.data());
      l2norm_rows(k.data(), L, pr.K, k_rinv.data());
    }
  }
};

HeadInputs head_inputs(const Problem& pr, const SequenceSpan& s, const QKBuffers& qk,
                       const HeadBuffers& hb) {
  HeadInputs in;
  in.T = s.length();
  in.K = pr.K;
  in.V = pr.V;
  in.q = qk.q.data();
  in.k = qk.k.data();
  in.v = hb.v.data();
  in.g = hb.g.data();
  in.beta = hb.beta.data();
  in.h0 = hb.has_h0 ? hb.h0.data() : nullptr;
  in.scale = pr.scale;
  return in;
}

// The first checkpoint row of sequence n: Σ_{m<n} floor(len_m / (64 e)).
int64_t checkpoint_row0(const Problem& pr, int64_t n) {
  const int64_t every = 64 * pr.checkpoint_chunks;
  if (!pr.varlen) return n * (pr.T / every);
  int64_t row = 0;
  for (int64_t m = 0; m < n; ++m) row += (pr.cu_seqlens_host[size_t(m + 1)] - pr.cu_seqlens_host[size_t(m)]) / every;
  return row;
}

// One (sequence, value head) forward, its state also written to the checkpoints
// after every 64 e tokens: the sequence runs as segments of 64 e tokens, each
// from the state the previous one left (segments start at chunk boundaries, so
// each is the chunked algorithm's own computation of those chunks).
template <typename Forward>
void forward_with_checkpoints(const Problem& pr, const flashqla_gdn_fwd_params_t& p, int64_t n, int64_t hv,
                              const HeadInputs& in, const HeadOutputs& out, Forward forward) {
  const int64_t every = 64 * pr.checkpoint_chunks, K = in.K, V = in.V;
  std::vector<double> state(in.h0 ? in.h0 : nullptr, in.h0 ? in.h0 + K * V : nullptr), next(size_t(K * V));
  int64_t row = checkpoint_row0(pr, n);
  for (int64_t t0 = 0; t0 < in.T || t0 == 0; t0 += every) {
    HeadInputs part = in;
    part.T = std::min(every, in.T - t0);
    part.q = in.q + t0 * K, part.k = in.k + t0 * K, part.v = in.v + t0 * V, part.g = in.g + t0;
    part.beta = in.beta + t0;
    part.h0 = state.empty() ? nullptr : state.data();
    forward(part, HeadOutputs{out.o + t0 * V, next.data()});
    state = next;
    if (part.T == every) scatter_state(p.checkpoints, p.state_v_first != 0, row++, hv, K, V, state.data());
  }
  if (out.ht) std::copy(state.begin(), state.end(), out.ht);
}

}  // namespace

void gdn_forward(const Problem& pr, const flashqla_gdn_fwd_params_t& p) {
  const int64_t items = pr.N * pr.HV;
  const int threads = resolve_num_threads(p.cpu_num_threads, items);
  parallel_for(items, threads, [&](int64_t item) {
    const int64_t n = item / pr.HV, hv = item % pr.HV, h = hv / pr.group;
    const SequenceSpan s = sequence_span(pr, n);
    // The state's row: the sequence's own, or its slot of the pool (each item
    // reads its row before it writes it, and no two sequences share a slot).
    const int64_t state = pr.pooled ? pr.state_indices_host[size_t(n)] : n;
    QKBuffers qk;
    qk.load(pr, p, s, h);
    HeadBuffers hb;
    hb.load(pr, p, s, state, hv);
    std::vector<double> o(static_cast<size_t>(s.length() * pr.V)), ht(static_cast<size_t>(pr.K * pr.V));
    const HeadInputs in = head_inputs(pr, s, qk, hb);
    const HeadOutputs out{o.data(), ht.data()};
    const auto forward = [&](const HeadInputs& i, const HeadOutputs& o_) {
      if (p.cpu_algorithm == FLASHQLA_CPU_ALGORITHM_RECURRENT) {
        recurrent_forward(i, o_);
      } else {
        chunked_forward(i, o_);
      }
    };
    if (pr.checkpoint_chunks > 0) {
      forward_with_checkpoints(pr, p, n, hv, in, out, forward);
    } else {
      forward(in, out);
    }
    scatter_rows(p.o, s, hv, pr.V, o.data());
    if (pr.output_final_state && state >= 0) {
      scatter_state(p.final_state, p.state_v_first != 0, state, hv, pr.K, pr.V, ht.data());
    }
  });
}

void gdn_backward(const Problem& pr, const flashqla_gdn_bwd_params_t& bp) {
  const flashqla_gdn_fwd_params_t& p = bp.fwd;
  const bool v_first = p.state_v_first != 0;
  const int64_t items = pr.N * pr.H;
  const int threads = resolve_num_threads(p.cpu_num_threads, items);
  parallel_for(items, threads, [&](int64_t item) {
    const int64_t n = item / pr.H, h = item % pr.H;
    const SequenceSpan s = sequence_span(pr, n);
    const int64_t L = s.length(), K = pr.K, V = pr.V;
    QKBuffers qk;
    qk.load(pr, p, s, h);
    // dq, dk of the (normalised) q/k head, summed over its value heads.
    std::vector<double> dq_sum(static_cast<size_t>(L * K), 0.0), dk_sum(static_cast<size_t>(L * K), 0.0);
    std::vector<double> d_o(static_cast<size_t>(L * V)), dht, dq(static_cast<size_t>(L * K)), dk(static_cast<size_t>(L * K)),
        dv(static_cast<size_t>(L * V)), dg(static_cast<size_t>(L)), dbeta(static_cast<size_t>(L)), dh0(static_cast<size_t>(K * V));
    for (int64_t hv = h * pr.group; hv < (h + 1) * pr.group; ++hv) {
      HeadBuffers hb;
      hb.load(pr, p, s, n, hv);
      gather_rows(bp.d_o, s, hv, V, d_o.data());
      HeadGradInputs gin{d_o.data(), nullptr};
      if (bp.d_final_state.data) {
        dht.resize(static_cast<size_t>(K * V));
        gather_state(bp.d_final_state, v_first, n, hv, K, V, dht.data());
        gin.dht = dht.data();
      }
      const HeadInputs in = head_inputs(pr, s, qk, hb);
      const HeadGrads grads{dq.data(), dk.data(), dv.data(), dg.data(), dbeta.data(), dh0.data()};
      if (p.cpu_algorithm == FLASHQLA_CPU_ALGORITHM_RECURRENT) {
        recurrent_backward(in, gin, grads);
      } else {
        chunked_backward(in, gin, grads);
      }
      for (size_t i = 0; i < dq.size(); ++i) {
        dq_sum[i] += dq[i];
        dk_sum[i] += dk[i];
      }
      for (int64_t t = 0; t < L; ++t) dbeta[size_t(t)] *= hb.dbeta_draw[size_t(t)];
      scatter_rows(bp.dv, s, hv, V, dv.data());
      scatter_scalars(bp.dg, s, hv, dg.data());
      scatter_scalars(bp.dbeta, s, hv, dbeta.data());
      if (pr.has_initial_state) scatter_state(bp.d_initial_state, v_first, n, hv, K, V, dh0.data());
    }
    if (p.use_qk_l2norm) {
      l2norm_rows_backward(qk.q.data(), qk.q_rinv.data(), L, K, dq_sum.data());
      l2norm_rows_backward(qk.k.data(), qk.k_rinv.data(), L, K, dk_sum.data());
    }
    scatter_rows(bp.dq, s, h, K, dq_sum.data());
    scatter_rows(bp.dk, s, h, K, dk_sum.data());
  });
}

}  // namespace flashqla::cpu
