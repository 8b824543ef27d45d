// One (sequence, value head) of a GDN call as dense fp64 row-major arrays:
// the unit both CPU algorithms (recurrent and chunked) compute on. The CPU
// backend gathers strided, any-dtype tensors into this form (applying
// l2norm and the beta activation) and scatters results back.
#pragma once

#include <cstdint>

namespace flashqla::cpu {

struct HeadInputs {
  int64_t T = 0, K = 0, V = 0;
  const double* q = nullptr;     // [T, K] (already l2-normalised if requested)
  const double* k = nullptr;     // [T, K]
  const double* v = nullptr;     // [T, V]
  const double* g = nullptr;     // [T]    log decay
  const double* beta = nullptr;  // [T]    after activation
  const double* h0 = nullptr;    // [K, V] or nullptr (zero state)
  double scale = 1.0;
};

struct HeadOutputs {
  double* o = nullptr;   // [T, V]
  double* ht = nullptr;  // [K, V] final state (may be nullptr)
};

struct HeadGradInputs {
  const double* d_o = nullptr;  // [T, V]
  const double* dht = nullptr;  // [K, V] or nullptr (zero)
};

// Every array is overwritten (not accumulated).
struct HeadGrads {
  double* dq = nullptr;     // [T, K]
  double* dk = nullptr;     // [T, K]
  double* dv = nullptr;     // [T, V]
  double* dg = nullptr;     // [T]
  double* dbeta = nullptr;  // [T]
  double* dh0 = nullptr;    // [K, V] (may be nullptr)
};

}  // namespace flashqla::cpu
