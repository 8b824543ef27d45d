#include "test_support.h"

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <utility>

#include "core/dtype.h"

namespace flashqla_test {

size_t dtype_bytes(flashqla_dtype_t d) { return flashqla::dtype_size(d); }

double load(const void* base, flashqla_dtype_t d, int64_t i) {
  return flashqla::load_as_double(base, d, i);
}

void store(void* base, flashqla_dtype_t d, int64_t i, double x) {
  flashqla::store_from_double(base, d, i, x);
}

// ---------------------------------------------------------------------------
// HostTensor

HostTensor::HostTensor(std::vector<int64_t> shape_in, flashqla_dtype_t dtype_in, int64_t row_pad)
    : shape(std::move(shape_in)), dtype(dtype_in) {
  const int rank = int(shape.size());
  if (rank < 1 || rank > 4) throw std::invalid_argument("HostTensor: rank must be 1..4");
  if (row_pad < 0) throw std::invalid_argument("HostTensor: row_pad must be >= 0");
  for (int64_t extent : shape) {
    if (extent < 0) throw std::invalid_argument("HostTensor: negative extent");
  }

  // The last dimension is contiguous; a row (the last dimension) occupies
  // shape[rank-1] + row_pad elements; outer strides multiply the extents.
  desc.dtype = dtype;
  desc.stride[rank - 1] = 1;
  for (int d = rank - 2; d >= 0; --d) {
    const int64_t inner = shape[d + 1] + (d + 1 == rank - 1 ? row_pad : 0);
    desc.stride[d] = desc.stride[d + 1] * inner;
  }

  storage_elems = numel() == 0 ? 0 : shape[0] * desc.stride[0];
  bytes.assign(size_t(storage_elems) * dtype_bytes(dtype), 0);
  desc.data = bytes.empty() ? nullptr : bytes.data();
}

namespace {

// Points the descriptor at the tensor's own bytes (NULL when it has none).
void repoint(HostTensor& t) { t.desc.data = t.bytes.empty() ? nullptr : t.bytes.data(); }

// Leaves a moved-from tensor empty and consistent.
void clear(HostTensor& t) {
  t.shape.clear();
  t.bytes.clear();
  t.storage_elems = 0;
  repoint(t);
}

}  // namespace

HostTensor::HostTensor(const HostTensor& other)
    : shape(other.shape),
      dtype(other.dtype),
      bytes(other.bytes),
      desc(other.desc),
      storage_elems(other.storage_elems) {
  repoint(*this);
}

HostTensor::HostTensor(HostTensor&& other) noexcept
    : shape(std::move(other.shape)),
      dtype(other.dtype),
      bytes(std::move(other.bytes)),
      desc(other.desc),
      storage_elems(other.storage_elems) {
  repoint(*this);
  clear(other);
}

HostTensor& HostTensor::operator=(const HostTensor& other) {
  if (this != &other) {
    shape = other.shape;
    dtype = other.dtype;
    bytes = other.bytes;
    desc = other.desc;
    storage_elems = other.storage_elems;
    repoint(*this);
  }
  return *this;
}

HostTensor& HostTensor::operator=(HostTensor&& other) noexcept {
  if (this != &other) {
    shape = std::move(other.shape);
    dtype = other.dtype;
    bytes = std::move(other.bytes);
    desc = other.desc;
    storage_elems = other.storage_elems;
    repoint(*this);
    clear(other);
  }
  return *this;
}

int64_t HostTensor::numel() const {
  if (shape.empty()) return 0;
  int64_t n = 1;
  for (int64_t extent : shape) n *= extent;
  return n;
}

int64_t HostTensor::offset(const std::vector<int64_t>& idx) const {
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * desc.stride[d];
  return off;
}

namespace {

// Storage offset of the element at a logical row-major index.
int64_t storage_offset(const HostTensor& t, int64_t logical) {
  int64_t off = 0;
  for (int d = int(t.shape.size()) - 1; d >= 0; --d) {
    const int64_t extent = t.shape[size_t(d)];
    off += (logical % extent) * t.desc.stride[d];
    logical /= extent;
  }
  return off;
}

bool is_index(flashqla_dtype_t d) {
  return d == FLASHQLA_DTYPE_INT32 || d == FLASHQLA_DTYPE_INT64;
}

void store_index(void* base, flashqla_dtype_t d, int64_t i, int64_t x) {
  if (d == FLASHQLA_DTYPE_INT32) {
    static_cast<int32_t*>(base)[i] = int32_t(x);
  } else {
    static_cast<int64_t*>(base)[i] = x;
  }
}

}  // namespace

double HostTensor::get_flat(int64_t logical) const {
  return load(bytes.data(), dtype, storage_offset(*this, logical));
}

void HostTensor::set_flat(int64_t logical, double x) {
  const int64_t off = storage_offset(*this, logical);
  if (is_index(dtype)) {
    store_index(bytes.data(), dtype, off, int64_t(x));
  } else {
    store(bytes.data(), dtype, off, x);
  }
}

void HostTensor::fill(double x) {
  for (int64_t i = 0; i < storage_elems; ++i) {
    if (is_index(dtype)) {
      store_index(bytes.data(), dtype, i, int64_t(x));
    } else {
      store(bytes.data(), dtype, i, x);
    }
  }
}

void HostTensor::fill_nan() {
  if (is_index(dtype)) return;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t i = 0; i < storage_elems; ++i) store(bytes.data(), dtype, i, nan);
}

std::vector<double> HostTensor::to_vector() const {
  std::vector<double> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[size_t(i)] = get_flat(i);
  return out;
}

// ---------------------------------------------------------------------------
// Error norms

double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double diff2 = 0.0;
  double ref2 = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - b[i];
    diff2 += d * d;
    ref2 += b[i] * b[i];
  }
  if (any_nan(a)) return std::numeric_limits<double>::quiet_NaN();
  const double diff = std::sqrt(diff2);
  return ref2 == 0.0 ? diff : diff / std::sqrt(ref2);
}

bool any_nan(const std::vector<double>& a) {
  for (double x : a) {
    if (std::isnan(x)) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// GdnCase

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

double log_sigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}

// Fills every logical element with randn.
void fill_randn(HostTensor& t, std::mt19937_64& rng, std::normal_distribution<double>& normal) {
  for (int64_t i = 0; i < t.numel(); ++i) t.set_flat(i, normal(rng));
}

// Fills q / k: randn per head vector (the last dimension), normalised to unit
// length when `normalise`.
void fill_qk(HostTensor& t, bool normalise, std::mt19937_64& rng,
             std::normal_distribution<double>& normal) {
  const int64_t dim = t.shape.back();
  std::vector<double> row(static_cast<size_t>(dim));
  for (int64_t base = 0; base < t.numel(); base += dim) {
    double norm2 = 0.0;
    for (double& x : row) {
      x = normal(rng);
      norm2 += x * x;
    }
    const double inv = normalise && norm2 > 0.0 ? 1.0 / std::sqrt(norm2) : 1.0;
    for (int64_t i = 0; i < dim; ++i) t.set_flat(base + i, row[size_t(i)] * inv);
  }
}

HostTensor poisoned(std::vector<int64_t> shape, flashqla_dtype_t dtype, int64_t row_pad = 0) {
  HostTensor t(std::move(shape), dtype, row_pad);
  t.fill_nan();
  return t;
}

}  // namespace

void GdnCase::allocate_and_fill(uint64_t seed, double g_value, double beta_value,
                                double gate_div) {
  if (!cu_seqlens.empty()) {
    if (B != 1) throw std::invalid_argument("GdnCase: B must be 1 with cu_seqlens");
    T = cu_seqlens.back();
  }
  const int64_t n = N();
  const std::vector<int64_t> qk_shape = {B, T, H, K};
  const std::vector<int64_t> v_shape = {B, T, HV, V};
  const std::vector<int64_t> gate_shape = {B, T, HV};
  const std::vector<int64_t> state_shape =
      state_v_first ? std::vector<int64_t>{n, HV, V, K} : std::vector<int64_t>{n, HV, K, V};

  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);

  q = HostTensor(qk_shape, dtype, row_pad);
  k = HostTensor(qk_shape, dtype, row_pad);
  v = HostTensor(v_shape, dtype, row_pad);
  fill_qk(q, !l2norm, rng, normal);
  fill_qk(k, !l2norm, rng, normal);
  fill_randn(v, rng, normal);

  g = HostTensor(gate_shape, gate_dtype);
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double x = normal(rng);
    g.set_flat(i, std::isfinite(g_value) ? g_value : log_sigmoid(x) / gate_div);
  }

  beta = HostTensor(gate_shape, gate_dtype);
  const bool beta_is_logit = beta_act != FLASHQLA_BETA_IDENTITY;
  for (int64_t i = 0; i < beta.numel(); ++i) {
    const double x = normal(rng);
    if (std::isfinite(beta_value)) {
      beta.set_flat(i, beta_value);
    } else {
      beta.set_flat(i, beta_is_logit ? x : sigmoid(x));
    }
  }

  h0 = HostTensor();
  if (with_h0) {
    h0 = HostTensor(state_shape, state_dtype);
    fill_randn(h0, rng, normal);
  }

  d_o = HostTensor(v_shape, dtype);
  fill_randn(d_o, rng, normal);
  dht = HostTensor();
  if (with_dht) {
    dht = HostTensor(state_shape, state_dtype);
    fill_randn(dht, rng, normal);
  }

  cu = HostTensor();
  if (!cu_seqlens.empty()) {
    cu = HostTensor({int64_t(cu_seqlens.size())},
                    cu_seqlens_int64 ? FLASHQLA_DTYPE_INT64 : FLASHQLA_DTYPE_INT32);
    for (size_t i = 0; i < cu_seqlens.size(); ++i) cu.set_flat(int64_t(i), double(cu_seqlens[i]));
  }

  o = poisoned(v_shape, dtype, o_row_pad);
  ht = poisoned(state_shape, state_dtype);
  dq = poisoned(qk_shape, dtype);
  dk = poisoned(qk_shape, dtype);
  dv = poisoned(v_shape, dtype);
  dg = poisoned(gate_shape, gate_dtype);
  dbeta = poisoned(gate_shape, gate_dtype);
  dh0 = poisoned(state_shape, state_dtype);
}

void GdnCase::poison_outputs() {
  for (HostTensor* t : {&o, &ht, &dq, &dk, &dv, &dg, &dbeta, &dh0}) t->fill_nan();
}

flashqla_gdn_fwd_params_t GdnCase::fwd_params(flashqla_cpu_algorithm_t algo) {
  flashqla_gdn_fwd_params_t p;
  flashqla_gdn_fwd_params_init(&p);
  p.B = B;
  p.T = T;
  p.H = H;
  p.HV = HV;
  p.K = K;
  p.V = V;
  p.N = N();
  p.q = q.desc;
  p.k = k.desc;
  p.v = v.desc;
  p.g = g.desc;
  p.beta = beta.desc;
  if (with_h0) {
    p.initial_state = h0.desc;
    p.initial_state_n = N();
  }
  if (!cu_seqlens.empty()) p.cu_seqlens = cu.desc;
  p.o = o.desc;
  p.final_state = ht.desc;
  p.output_final_state = 1;
  p.scale = scale;
  p.state_v_first = state_v_first ? 1 : 0;
  p.use_qk_l2norm = l2norm ? 1 : 0;
  p.beta_activation = beta_act;
  p.backend = FLASHQLA_BACKEND_CPU;
  p.cpu_algorithm = algo;
  return p;
}

flashqla_gdn_bwd_params_t GdnCase::bwd_params(flashqla_cpu_algorithm_t algo) {
  flashqla_gdn_bwd_params_t p;
  flashqla_gdn_bwd_params_init(&p);
  p.fwd = fwd_params(algo);
  p.fwd.output_final_state = 0;
  p.fwd.o = flashqla_tensor_t{};
  p.fwd.final_state = flashqla_tensor_t{};
  p.d_o = d_o.desc;
  if (with_dht) p.d_final_state = dht.desc;
  p.dq = dq.desc;
  p.dk = dk.desc;
  p.dv = dv.desc;
  p.dg = dg.desc;
  p.dbeta = dbeta.desc;
  if (with_h0) p.d_initial_state = dh0.desc;
  return p;
}

}  // namespace flashqla_test
