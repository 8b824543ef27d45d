#include "cpu/recurrent_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace flashqla::cpu {
namespace {

constexpr int64_t kCheckpointEvery = 64;

// S ← exp(g_t) S, then the delta-rule write of token t. Returns nothing;
// `vprime` receives beta_t (v_t − Sᵀ k_t) computed after the decay.
void step(double* S, int64_t K, int64_t V, const double* k, const double* v, double g,
          double beta, double* vprime) {
  const double decay = std::exp(g);
  for (int64_t i = 0; i < K * V; ++i) S[i] *= decay;
  for (int64_t j = 0; j < V; ++j) vprime[j] = v[j];
  for (int64_t i = 0; i < K; ++i) {
    const double ki = k[i];
    const double* row = S + i * V;
    for (int64_t j = 0; j < V; ++j) vprime[j] -= ki * row[j];
  }
  for (int64_t j = 0; j < V; ++j) vprime[j] *= beta;
  for (int64_t i = 0; i < K; ++i) {
    const double ki = k[i];
    double* row = S + i * V;
    for (int64_t j = 0; j < V; ++j) row[j] += ki * vprime[j];
  }
}

}  // namespace

void recurrent_forward(const HeadInputs& in, const HeadOutputs& out) {
  const int64_t K = in.K, V = in.V;
  std::vector<double> S(static_cast<size_t>(K * V), 0.0), vprime(static_cast<size_t>(V));
  if (in.h0) std::copy(in.h0, in.h0 + K * V, S.begin());
  for (int64_t t = 0; t < in.T; ++t) {
    step(S.data(), K, V, in.k + t * K, in.v + t * V, in.g[t], in.beta[t], vprime.data());
    double* o = out.o + t * V;
    std::fill(o, o + V, 0.0);
    const double* q = in.q + t * K;
    for (int64_t i = 0; i < K; ++i) {
      const double qi = q[i] * in.scale;
      const double* row = S.data() + i * V;
      for (int64_t j = 0; j < V; ++j) o[j] += qi * row[j];
    }
  }
  if (out.ht) std::copy(S.begin(), S.end(), out.ht);
}

void recurrent_backward(const HeadInputs& in, const HeadGradInputs& gin, const HeadGrads& grads) {
  const int64_t T = in.T, K = in.K, V = in.V, KV = K * V;
  const int64_t n_segments = (T + kCheckpointEvery - 1) / kCheckpointEvery;

  // Forward pass keeping the state at the start of every segment.
  std::vector<double> checkpoints(static_cast<size_t>(std::max<int64_t>(n_segments, 1) * KV), 0.0);
  std::vector<double> S(static_cast<size_t>(KV), 0.0), vprime(static_cast<size_t>(V));
  if (in.h0) std::copy(in.h0, in.h0 + KV, S.begin());
  for (int64_t t = 0; t < T; ++t) {
    if (t % kCheckpointEvery == 0) {
      std::copy(S.begin(), S.end(), checkpoints.begin() + (t / kCheckpointEvery) * KV);
    }
    step(S.data(), K, V, in.k + t * K, in.v + t * V, in.g[t], in.beta[t], vprime.data());
  }

  // dS: gradient w.r.t. the state after the token being processed.
  std::vector<double> dS(static_cast<size_t>(KV), 0.0);
  if (gin.dht) std::copy(gin.dht, gin.dht + KV, dS.begin());

  // Per-segment storage of the states *before* each token, and v'.
  std::vector<double> before(static_cast<size_t>(kCheckpointEvery * KV)), vprimes(static_cast<size_t>(kCheckpointEvery * V));
  std::vector<double> after(static_cast<size_t>(KV)), dvprime(static_cast<size_t>(V)), dp(static_cast<size_t>(V)), Sdecayed(static_cast<size_t>(KV));

  for (int64_t seg = n_segments - 1; seg >= 0; --seg) {
    const int64_t t0 = seg * kCheckpointEvery, t1 = std::min(T, t0 + kCheckpointEvery);
    std::copy(checkpoints.begin() + seg * KV, checkpoints.begin() + (seg + 1) * KV, S.begin());
    for (int64_t t = t0; t < t1; ++t) {
      std::copy(S.begin(), S.end(), before.begin() + (t - t0) * KV);
      step(S.data(), K, V, in.k + t * K, in.v + t * V, in.g[t], in.beta[t],
           vprimes.data() + (t - t0) * V);
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const double* Sprev = before.data() + (t - t0) * KV;
      const double* vp = vprimes.data() + (t - t0) * V;
      const double* q = in.q + t * K;
      const double* k = in.k + t * K;
      const double* v = in.v + t * V;
      const double* dout = gin.d_o + t * V;
      const double decay = std::exp(in.g[t]);
      const double beta = in.beta[t];
      // S_after = decay·S_prev + k v'ᵀ
      for (int64_t i = 0; i < KV; ++i) Sdecayed[size_t(i)] = decay * Sprev[i];
      for (int64_t i = 0; i < K; ++i)
        for (int64_t j = 0; j < V; ++j) after[size_t(i * V + j)] = Sdecayed[size_t(i * V + j)] + k[i] * vp[j];

      // o_t = scale S_afterᵀ q: dq = scale S_after do;  dS += scale q doᵀ
      double* dq = grads.dq + t * K;
      for (int64_t i = 0; i < K; ++i) {
        double acc = 0.0;
        for (int64_t j = 0; j < V; ++j) acc += after[size_t(i * V + j)] * dout[j];
        dq[i] = in.scale * acc;
        for (int64_t j = 0; j < V; ++j) dS[size_t(i * V + j)] += in.scale * q[i] * dout[j];
      }
      // S_after = S_dec + k v'ᵀ: dk = dS v';  dv' = dSᵀ k
      double* dk = grads.dk + t * K;
      std::fill(dvprime.begin(), dvprime.end(), 0.0);
      for (int64_t i = 0; i < K; ++i) {
        double acc = 0.0;
        for (int64_t j = 0; j < V; ++j) {
          acc += dS[size_t(i * V + j)] * vp[j];
          dvprime[size_t(j)] += dS[size_t(i * V + j)] * k[i];
        }
        dk[i] = acc;
      }
      // v' = beta (v − p), p = S_decᵀ k
      double dbeta = 0.0;
      for (int64_t j = 0; j < V; ++j) {
        // v − p == v' / beta; recompute p to stay exact when beta == 0.
        double p = 0.0;
        for (int64_t i = 0; i < K; ++i) p += Sdecayed[size_t(i * V + j)] * k[i];
        dbeta += (v[j] - p) * dvprime[size_t(j)];
        grads.dv[t * V + j] = beta * dvprime[size_t(j)];
        dp[size_t(j)] = -beta * dvprime[size_t(j)];
      }
      grads.dbeta[t] = dbeta;
      // p = S_decᵀ k: dS_dec = dS + k dpᵀ;  dk += S_dec dp
      for (int64_t i = 0; i < K; ++i) {
        double acc = 0.0;
        for (int64_t j = 0; j < V; ++j) {
          acc += Sdecayed[size_t(i * V + j)] * dp[size_t(j)];
          dS[size_t(i * V + j)] += k[i] * dp[size_t(j)];
        }
        dk[i] += acc;
      }
      // S_dec = decay S_prev: dg = <S_dec, dS_dec>;  dS_prev = decay dS_dec
      double dg = 0.0;
      for (int64_t i = 0; i < KV; ++i) {
        dg += Sdecayed[size_t(i)] * dS[size_t(i)];
        dS[size_t(i)] *= decay;
      }
      grads.dg[t] = dg;
    }
  }
  if (grads.dh0) std::copy(dS.begin(), dS.end(), grads.dh0);
}

}  // namespace flashqla::cpu
