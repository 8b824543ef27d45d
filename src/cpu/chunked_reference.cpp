#include "cpu/chunked_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace flashqla::cpu {
namespace {

double dot(const double* a, const double* b, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// y[V] = xᵀ S for x[K], S[K×V].
void vec_mat(const double* x, const double* S, int64_t K, int64_t V, double* y) {
  std::fill(y, y + V, 0.0);
  for (int64_t i = 0; i < K; ++i) {
    const double xi = x[i];
    const double* row = S + i * V;
    for (int64_t j = 0; j < V; ++j) y[j] += xi * row[j];
  }
}

// y[K] = S x for S[K×V], x[V].
void mat_vec(const double* S, const double* x, int64_t K, int64_t V, double* y) {
  for (int64_t i = 0; i < K; ++i) y[i] = dot(S + i * V, x, V);
}

// S[K×V] += a · x yᵀ for x[K], y[V].
void add_outer(double* S, double a, const double* x, const double* y, int64_t K, int64_t V) {
  for (int64_t i = 0; i < K; ++i) {
    const double axi = a * x[i];
    double* row = S + i * V;
    for (int64_t j = 0; j < V; ++j) row[j] += axi * y[j];
  }
}

// Everything a chunk's backward needs, recomputed from its inputs and S.
struct ChunkRecompute {
  int64_t L, K, V;
  std::vector<double> gamma, Minv, KS, U, Vd, QK;
  // Minv = Γ ⊙ Ar = (I + StrictLower(diag(β)(K Kᵀ ⊙ Γ)))⁻¹

  ChunkRecompute(const double* q, const double* k, const double* v, const double* g,
                 const double* beta, int64_t L_, int64_t K_, int64_t V_, const double* S)
      : L(L_), K(K_), V(V_), gamma(static_cast<size_t>(L_)), Minv(static_cast<size_t>(L_ * L_)), KS(static_cast<size_t>(L_ * V_)),
        U(static_cast<size_t>(L_ * V_)), Vd(static_cast<size_t>(L_ * V_), 0.0), QK(static_cast<size_t>(L_ * L_), 0.0) {
    chunk_local_cumsum(g, L, gamma.data());
    ungated_inverse(k, beta, L, K, Minv.data());
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j <= i; ++j) Minv[size_t(i * L + j)] *= std::exp(gamma[size_t(i)] - gamma[size_t(j)]);
    for (int64_t i = 0; i < L; ++i) {
      vec_mat(k + i * K, S, K, V, &KS[size_t(i * V)]);
      const double e = std::exp(gamma[size_t(i)]);
      for (int64_t c = 0; c < V; ++c) U[size_t(i * V + c)] = v[i * V + c] - e * KS[size_t(i * V + c)];
    }
    // Vd = Minv diag(β) U
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        const double a = Minv[size_t(i * L + j)] * beta[j];
        for (int64_t c = 0; c < V; ++c) Vd[size_t(i * V + c)] += a * U[size_t(j * V + c)];
      }
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j <= i; ++j) QK[size_t(i * L + j)] = dot(q + i * K, k + j * K, K);
  }
  double G(int64_t i, int64_t j) const { return std::exp(gamma[size_t(i)] - gamma[size_t(j)]); }
};

}  // namespace

void chunk_local_cumsum(const double* g, int64_t L, double* gamma) {
  double acc = 0.0;
  for (int64_t i = 0; i < L; ++i) gamma[i] = (acc += g[i]);
}

void ungated_inverse(const double* k, const double* beta, int64_t L, int64_t K, double* Ar) {
  // Forward substitution, row by row: (I + A) Ar = I with A strictly lower,
  // A_ij = β_i k_i·k_j, so Ar_i = e_i − Σ_{m<i} A_im Ar_m.
  std::fill(Ar, Ar + L * L, 0.0);
  for (int64_t i = 0; i < L; ++i) {
    double* row = Ar + i * L;
    row[i] = 1.0;
    for (int64_t m = 0; m < i; ++m) {
      const double a = beta[i] * dot(k + i * K, k + m * K, K);
      const double* prev = Ar + m * L;
      for (int64_t j = 0; j <= m; ++j) row[j] -= a * prev[j];
    }
  }
}

void chunk_forward(const double* q, const double* k, const double* v, const double* gamma,
                   const double* beta, const double* Ar, int64_t L, int64_t K, int64_t V,
                   double scale, double* S, double* o, double* vd) {
  std::vector<double> U(static_cast<size_t>(L * V)), Vd(static_cast<size_t>(L * V), 0.0), tmp(static_cast<size_t>(V));
  // U = V − diag(e^γ) K S
  for (int64_t i = 0; i < L; ++i) {
    vec_mat(k + i * K, S, K, V, tmp.data());
    const double e = std::exp(gamma[i]);
    for (int64_t c = 0; c < V; ++c) U[size_t(i * V + c)] = v[i * V + c] - e * tmp[size_t(c)];
  }
  // Vd = (Γ ⊙ Ar) diag(β) U
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j <= i; ++j) {
      const double a = std::exp(gamma[i] - gamma[j]) * Ar[i * L + j] * beta[j];
      for (int64_t c = 0; c < V; ++c) Vd[size_t(i * V + c)] += a * U[size_t(j * V + c)];
    }
  // O = scale (diag(e^γ) Q S + (Γ ⊙ Q Kᵀ) Vd)
  for (int64_t i = 0; i < L; ++i) {
    double* oi = o + i * V;
    vec_mat(q + i * K, S, K, V, oi);
    const double e = std::exp(gamma[i]);
    for (int64_t c = 0; c < V; ++c) oi[c] *= e;
    for (int64_t j = 0; j <= i; ++j) {
      const double a = std::exp(gamma[i] - gamma[j]) * dot(q + i * K, k + j * K, K);
      for (int64_t c = 0; c < V; ++c) oi[c] += a * Vd[size_t(j * V + c)];
    }
    for (int64_t c = 0; c < V; ++c) oi[c] *= scale;
  }
  // S' = e^{γ_L} S + Kᵀ diag(e^{γ_L − γ}) Vd
  const double gl = gamma[L - 1];
  const double el = std::exp(gl);
  for (int64_t x = 0; x < K * V; ++x) S[x] *= el;
  for (int64_t j = 0; j < L; ++j) add_outer(S, std::exp(gl - gamma[j]), k + j * K, &Vd[size_t(j * V)], K, V);
  if (vd) std::copy(Vd.begin(), Vd.end(), vd);
}

void chunked_forward(const HeadInputs& in, const HeadOutputs& out) {
  const int64_t K = in.K, V = in.V;
  std::vector<double> S(static_cast<size_t>(K * V), 0.0), gamma(static_cast<size_t>(kChunkSize)), Ar(static_cast<size_t>(kChunkSize * kChunkSize));
  if (in.h0) std::copy(in.h0, in.h0 + K * V, S.begin());
  for (int64_t t0 = 0; t0 < in.T; t0 += kChunkSize) {
    const int64_t L = std::min(kChunkSize, in.T - t0);
    chunk_local_cumsum(in.g + t0, L, gamma.data());
    ungated_inverse(in.k + t0 * K, in.beta + t0, L, K, Ar.data());
    chunk_forward(in.q + t0 * K, in.k + t0 * K, in.v + t0 * V, gamma.data(), in.beta + t0,
                  Ar.data(), L, K, V, in.scale, S.data(), out.o + t0 * V, nullptr);
  }
  if (out.ht) std::copy(S.begin(), S.end(), out.ht);
}

void chunked_backward(const HeadInputs& in, const HeadGradInputs& gin, const HeadGrads& grads) {
  const int64_t T = in.T, K = in.K, V = in.V, KV = K * V;
  const int64_t n_chunks = (T + kChunkSize - 1) / kChunkSize;

  // Chunk-start states (the forward's state recompute).
  std::vector<double> states(static_cast<size_t>(std::max<int64_t>(n_chunks, 1) * KV), 0.0);
  {
    std::vector<double> S(static_cast<size_t>(KV), 0.0), gamma(static_cast<size_t>(kChunkSize)), Ar(static_cast<size_t>(kChunkSize * kChunkSize)),
        o(static_cast<size_t>(kChunkSize * V));
    if (in.h0) std::copy(in.h0, in.h0 + KV, S.begin());
    for (int64_t c = 0; c < n_chunks; ++c) {
      const int64_t t0 = c * kChunkSize, L = std::min(kChunkSize, T - t0);
      std::copy(S.begin(), S.end(), states.begin() + c * KV);
      chunk_local_cumsum(in.g + t0, L, gamma.data());
      ungated_inverse(in.k + t0 * K, in.beta + t0, L, K, Ar.data());
      chunk_forward(in.q + t0 * K, in.k + t0 * K, in.v + t0 * V, gamma.data(), in.beta + t0,
                    Ar.data(), L, K, V, in.scale, S.data(), o.data(), nullptr);
    }
  }

  // dSn: gradient w.r.t. the state at the end of the chunk being processed.
  std::vector<double> dSn(static_cast<size_t>(KV), 0.0), dS(static_cast<size_t>(KV));
  if (gin.dht) std::copy(gin.dht, gin.dht + KV, dSn.begin());
  std::vector<double> tmpK(static_cast<size_t>(K)), tmpV(static_cast<size_t>(V)), qs(static_cast<size_t>(V));

  for (int64_t c = n_chunks - 1; c >= 0; --c) {
    const int64_t t0 = c * kChunkSize, L = std::min(kChunkSize, T - t0);
    const double* S = states.data() + c * KV;
    const double* q = in.q + t0 * K;
    const double* k = in.k + t0 * K;
    const double* beta = in.beta + t0;
    const double* dO = gin.d_o + t0 * V;
    double* dq = grads.dq + t0 * K;
    double* dk = grads.dk + t0 * K;
    double* dv = grads.dv + t0 * V;
    double* dbeta = grads.dbeta + t0;
    const ChunkRecompute r(q, k, in.v + t0 * V, in.g + t0, beta, L, K, V, S);
    const double gl = r.gamma[size_t(L - 1)];
    const double el = std::exp(gl);

    std::vector<double> dgamma(static_cast<size_t>(L), 0.0), dVd(static_cast<size_t>(L * V), 0.0), dR(static_cast<size_t>(L * V), 0.0);
    std::fill(dq, dq + L * K, 0.0);
    std::fill(dk, dk + L * K, 0.0);
    std::fill(dbeta, dbeta + L, 0.0);

    // 1. S' = e^{γ_L} S + Σ_j b_j k_j Vd_jᵀ, b_j = e^{γ_L − γ_j}
    for (int64_t x = 0; x < KV; ++x) dS[size_t(x)] = el * dSn[size_t(x)];
    dgamma[size_t(L - 1)] += el * dot(S, dSn.data(), KV);
    for (int64_t j = 0; j < L; ++j) {
      const double b = std::exp(gl - r.gamma[size_t(j)]);
      vec_mat(k + j * K, dSn.data(), K, V, tmpV.data());  // k_jᵀ dS'
      for (int64_t cc = 0; cc < V; ++cc) dVd[size_t(j * V + cc)] += b * tmpV[size_t(cc)];
      mat_vec(dSn.data(), &r.Vd[size_t(j * V)], K, V, tmpK.data());  // dS' Vd_j
      for (int64_t i = 0; i < K; ++i) dk[j * K + i] += b * tmpK[size_t(i)];
      if (j != L - 1) {  // b_{L−1} = 1 has no gate dependence: adding and removing x would only round
        const double x = b * dot(tmpV.data(), &r.Vd[size_t(j * V)], V);
        dgamma[size_t(L - 1)] += x;
        dgamma[size_t(j)] -= x;
      }
    }

    // 2. O = scale (diag(e^γ) Q S + P Vd),  P = Γ ⊙ Q Kᵀ (i ≥ j)
    for (int64_t i = 0; i < L; ++i) {
      const double e = std::exp(r.gamma[size_t(i)]);
      for (int64_t cc = 0; cc < V; ++cc) tmpV[size_t(cc)] = in.scale * dO[i * V + cc];  // dOs_i
      vec_mat(q + i * K, S, K, V, qs.data());  // (Q S)_i
      dgamma[size_t(i)] += e * dot(qs.data(), tmpV.data(), V);
      mat_vec(S, tmpV.data(), K, V, tmpK.data());
      for (int64_t x = 0; x < K; ++x) dq[i * K + x] += e * tmpK[size_t(x)];
      add_outer(dS.data(), e, q + i * K, tmpV.data(), K, V);
      for (int64_t j = 0; j <= i; ++j) {
        const double G = r.G(i, j);
        const double P = G * r.QK[size_t(i * L + j)];
        const double dP = dot(tmpV.data(), &r.Vd[size_t(j * V)], V);
        for (int64_t cc = 0; cc < V; ++cc) dVd[size_t(j * V + cc)] += P * tmpV[size_t(cc)];
        const double dQK = dP * G;
        for (int64_t x = 0; x < K; ++x) {
          dq[i * K + x] += dQK * k[j * K + x];
          dk[j * K + x] += dQK * q[i * K + x];
        }
        if (j != i) {  // Γ_ii = 1: no gate dependence on the diagonal
          dgamma[size_t(i)] += dP * P;
          dgamma[size_t(j)] -= dP * P;
        }
      }
    }

    // 3. Vd = Minv R, R = diag(β) U:  dR = Minvᵀ dVd,  dM = −dR Vdᵀ (strict lower)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j <= i; ++j) {
        const double m = r.Minv[size_t(i * L + j)];
        for (int64_t cc = 0; cc < V; ++cc) dR[size_t(j * V + cc)] += m * dVd[size_t(i * V + cc)];
      }
    for (int64_t i = 1; i < L; ++i)
      for (int64_t j = 0; j < i; ++j) {
        const double dA = -dot(&dR[size_t(i * V)], &r.Vd[size_t(j * V)], V);
        const double G = r.G(i, j);
        const double kk = dot(k + i * K, k + j * K, K);
        const double A = beta[i] * kk * G;
        dbeta[i] += dA * kk * G;
        dgamma[size_t(i)] += dA * A;
        dgamma[size_t(j)] -= dA * A;
        const double dkk = dA * beta[i] * G;
        for (int64_t x = 0; x < K; ++x) {
          dk[i * K + x] += dkk * k[j * K + x];
          dk[j * K + x] += dkk * k[i * K + x];
        }
      }

    // 4. R = diag(β) U,  U = V − diag(e^γ) K S
    for (int64_t i = 0; i < L; ++i) {
      const double e = std::exp(r.gamma[size_t(i)]);
      dbeta[i] += dot(&r.U[size_t(i * V)], &dR[size_t(i * V)], V);
      for (int64_t cc = 0; cc < V; ++cc) {
        const double dU = beta[i] * dR[size_t(i * V + cc)];
        dv[i * V + cc] = dU;
        tmpV[size_t(cc)] = -e * dU;  // dKS_i
      }
      dgamma[size_t(i)] += dot(&r.KS[size_t(i * V)], tmpV.data(), V);
      mat_vec(S, tmpV.data(), K, V, tmpK.data());
      for (int64_t x = 0; x < K; ++x) dk[i * K + x] += tmpK[size_t(x)];
      add_outer(dS.data(), 1.0, k + i * K, tmpV.data(), K, V);
    }

    // 5. γ = cumsum(g): dg_t = Σ_{i ≥ t} dγ_i
    double acc = 0.0;
    for (int64_t i = L - 1; i >= 0; --i) grads.dg[t0 + i] = (acc += dgamma[size_t(i)]);

    dSn.swap(dS);
  }
  if (grads.dh0) std::copy(dSn.begin(), dSn.end(), grads.dh0);
}

}  // namespace flashqla::cpu
