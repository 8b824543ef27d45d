// Helpers shared by the C++ tests: host tensors of any API dtype, random
// inputs, a GDN problem that fills forward/backward params, and error norms.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "flashqla/flashqla.h"

namespace flashqla_test {

size_t dtype_bytes(flashqla_dtype_t d);
double load(const void* base, flashqla_dtype_t d, int64_t i);
void store(void* base, flashqla_dtype_t d, int64_t i, double x);

// A dense row-major host tensor of a given shape and dtype. Its descriptor
// (flashqla_tensor_t) has contiguous strides unless `row_pad` > 0, in which
// case every dimension but the last is padded by `row_pad` elements (a
// non-contiguous view, as a slice of a packed projection would be).
struct HostTensor {
  std::vector<int64_t> shape;
  flashqla_dtype_t dtype = FLASHQLA_DTYPE_FLOAT64;
  std::vector<unsigned char> bytes;
  flashqla_tensor_t desc{};
  int64_t storage_elems = 0;

  HostTensor() = default;
  HostTensor(std::vector<int64_t> shape, flashqla_dtype_t dtype, int64_t row_pad = 0);
  // Copies and moves re-point desc.data at the destination's own bytes.
  HostTensor(const HostTensor& other);
  HostTensor(HostTensor&& other) noexcept;
  HostTensor& operator=(const HostTensor& other);
  HostTensor& operator=(HostTensor&& other) noexcept;

  int64_t numel() const;
  // Logical element access by multi-index (row-major over `shape`).
  int64_t offset(const std::vector<int64_t>& idx) const;
  double get_flat(int64_t logical) const;  // logical row-major index
  void set_flat(int64_t logical, double x);
  void fill(double x);                 // every storage element, padding included
  void fill_nan();                     // poison (NaN in every float dtype)
  std::vector<double> to_vector() const;  // logical row-major values
  flashqla_tensor_t* operator->() { return &desc; }
  bool empty_data() const { return bytes.empty(); }
};

// Relative error ‖a − b‖₂ / ‖b‖₂ (absolute ‖a − b‖₂ when ‖b‖₂ == 0).
double rel_error(const std::vector<double>& a, const std::vector<double>& b);
bool any_nan(const std::vector<double>& a);

// A GDN problem: sizes, options, inputs and outputs, all on the host.
struct GdnCase {
  int64_t B = 1, T = 0, H = 1, HV = 1, K = 8, V = 8;
  std::vector<int64_t> cu_seqlens;  // empty: fixed length
  bool cu_seqlens_int64 = false;
  bool with_h0 = false;
  bool with_dht = false;
  bool state_v_first = false;
  bool l2norm = false;
  flashqla_beta_activation_t beta_act = FLASHQLA_BETA_IDENTITY;
  double scale = NAN;
  flashqla_dtype_t dtype = FLASHQLA_DTYPE_FLOAT64;  // q, k, v, o and their grads
  flashqla_dtype_t gate_dtype = FLASHQLA_DTYPE_FLOAT64;  // g, beta, dg, dbeta
  flashqla_dtype_t state_dtype = FLASHQLA_DTYPE_FLOAT64;  // h0, ht, dht, dh0
  int64_t row_pad = 0;  // > 0: non-contiguous views for q, k, v
  int64_t o_row_pad = 0;  // > 0: o a non-contiguous view

  HostTensor q, k, v, g, beta, h0, o, ht, d_o, dht, dq, dk, dv, dg, dbeta, dh0, cu;

  int64_t N() const { return cu_seqlens.empty() ? B : int64_t(cu_seqlens.size()) - 1; }
  // Allocates every tensor and fills the inputs with random values:
  // q, k ~ randn (l2-normalised unless `l2norm`, in which case the op does
  // it), v ~ randn, g = logsigmoid(randn)/gate_div (or `g_value` if finite),
  // beta ~ sigmoid(randn) (or `beta_value` if finite), h0 ~ randn.
  void allocate_and_fill(uint64_t seed, double g_value = NAN, double beta_value = NAN,
                         double gate_div = 4.0);
  void poison_outputs();
  flashqla_gdn_fwd_params_t fwd_params(flashqla_cpu_algorithm_t algo);
  flashqla_gdn_bwd_params_t bwd_params(flashqla_cpu_algorithm_t algo);
};

// Appends the gate and beta edge cases every suite runs on top of `base`:
// g = 0, g = −20 (decay to nothing within a token), beta = 0 and beta = 1.
// Config needs `name`, `g_value` and `beta_value` members.
template <typename Config>
void append_gate_and_beta_edge_cases(std::vector<Config>& out, Config base) {
  const struct {
    const char* name;
    double g, beta;
  } cases[] = {{"g_zero", 0.0, NAN}, {"g_minus20", -20.0, NAN}, {"beta_zero", NAN, 0.0}, {"beta_one", NAN, 1.0}};
  for (const auto& c : cases) {
    base.name = c.name;
    base.g_value = c.g;
    base.beta_value = c.beta;
    out.push_back(base);
  }
}

}  // namespace flashqla_test
