#include "state_pool_cases.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

namespace flashqla_test {

flashqla_gdn_fwd_params_t pooled_params(flashqla_gdn_fwd_params_t p, const flashqla_tensor_t& pool,
                                        const flashqla_tensor_t& indices, int64_t slots) {
  p.initial_state = pool;
  p.initial_state_n = slots;
  p.final_state = pool;
  p.output_final_state = 1;
  p.state_indices = indices;
  return p;
}

flashqla_gdn_fwd_params_t PoolCase::params() {
  return pooled_params(c.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED), pool.desc, index_tensor.desc, slots);
}

PoolCase make_pool_case(const std::string& name, uint64_t seed, std::vector<int64_t> cu_seqlens, int64_t B,
                        int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V, int64_t slots, bool v_first,
                        flashqla_dtype_t token_dtype, flashqla_dtype_t pool_dtype, bool int64_indices) {
  PoolCase pc;
  pc.name = name;
  GdnCase& c = pc.c;
  c.B = cu_seqlens.empty() ? B : 1;
  c.T = cu_seqlens.empty() ? T : cu_seqlens.back();
  c.H = H, c.HV = HV, c.K = K, c.V = V;
  c.cu_seqlens = std::move(cu_seqlens);
  c.state_v_first = v_first;
  c.dtype = token_dtype;
  c.gate_dtype = token_dtype == FLASHQLA_DTYPE_FLOAT64 ? FLASHQLA_DTYPE_FLOAT64 : FLASHQLA_DTYPE_FLOAT32;
  c.state_dtype = FLASHQLA_DTYPE_FLOAT64;
  c.with_h0 = false;
  c.allocate_and_fill(seed);
  const int64_t N = c.N();

  // Slots: a random permutation's first N, about a quarter of them -1.
  std::mt19937_64 rng(seed * 7 + 1);
  std::vector<int64_t> perm(static_cast<size_t>(slots));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  pc.slots = slots;
  pc.indices.resize(size_t(N));
  for (int64_t n = 0; n < N; ++n) pc.indices[size_t(n)] = rng() % 4 == 0 ? -1 : perm[size_t(n)];
  pc.index_tensor = HostTensor({N}, int64_indices ? FLASHQLA_DTYPE_INT64 : FLASHQLA_DTYPE_INT32);
  for (int64_t n = 0; n < N; ++n) pc.index_tensor.set_flat(n, double(pc.indices[size_t(n)]));

  const std::vector<int64_t> row_shape = v_first ? std::vector<int64_t>{HV, V, K} : std::vector<int64_t>{HV, K, V};
  const int64_t row = HV * K * V;
  pc.pool = HostTensor({slots, row_shape[0], row_shape[1], row_shape[2]}, pool_dtype);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int64_t i = 0; i < pc.pool.numel(); ++i) pc.pool.set_flat(i, normal(rng));

  // The reference: the plain forward, fp64, initial states out of the pool.
  GdnCase ref = c;
  ref.with_h0 = true;
  ref.h0 = HostTensor({N, row_shape[0], row_shape[1], row_shape[2]}, FLASHQLA_DTYPE_FLOAT64);
  ref.ht = HostTensor({N, row_shape[0], row_shape[1], row_shape[2]}, FLASHQLA_DTYPE_FLOAT64);
  ref.o = HostTensor(c.o.shape, FLASHQLA_DTYPE_FLOAT64);
  for (int64_t n = 0; n < N; ++n) {
    const int64_t s = pc.indices[size_t(n)];
    for (int64_t i = 0; i < row; ++i) ref.h0.set_flat(n * row + i, s >= 0 ? pc.pool.get_flat(s * row + i) : 0.0);
  }
  flashqla_gdn_fwd_params_t rp = ref.fwd_params(FLASHQLA_CPU_ALGORITHM_CHUNKED);
  EXPECT_EQ(flashqla_gdn_fwd(&rp), FLASHQLA_STATUS_SUCCESS) << name << ": " << flashqla_last_error_message();
  pc.expected_o = ref.o;
  pc.expected_pool = pc.pool;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t s = pc.indices[size_t(n)];
    if (s < 0) continue;
    for (int64_t i = 0; i < row; ++i) pc.expected_pool.set_flat(s * row + i, ref.ht.get_flat(n * row + i));
  }
  return pc;
}

namespace {

constexpr flashqla_dtype_t kF64 = FLASHQLA_DTYPE_FLOAT64, kF32 = FLASHQLA_DTYPE_FLOAT32,
                           kB16 = FLASHQLA_DTYPE_BFLOAT16;

PoolCase cpu_case(size_t i) {
  switch (i) {
    case 0: return make_pool_case("varlen_kfirst_fp32", 11, {0, 5, 70, 70, 131, 200}, 0, 0, 2, 4, 8, 6, 9, false,
                                  kF64, kF32, false);
    case 1: return make_pool_case("varlen_vfirst_bf16_int64", 12, {0, 64, 65, 129, 300}, 0, 0, 1, 2, 7, 5, 6, true,
                                  kF64, kB16, true);
    default: return make_pool_case("batch_kfirst_fp64", 13, {}, 3, 50, 1, 1, 4, 4, 5, false, kF64, kF64, false);
  }
}

PoolCase gpu_case(size_t i) {
  switch (i) {
    // The tensor-core forward (bf16, K = V = 128), both pool layouts and dtypes.
    case 0: return make_pool_case("tc_kfirst_fp32", 21, {0, 100, 100, 357, 420, 1000}, 0, 0, 2, 4, 128, 128, 11,
                                  false, kB16, kF32, false);
    case 1: return make_pool_case("tc_vfirst_bf16", 22, {0, 64, 129, 700}, 0, 0, 1, 2, 128, 128, 7, true, kB16,
                                  kB16, true);
    // A long sequence over few heads: sequence pieces read and write its slot.
    case 2: return make_pool_case("tc_pieces_vfirst_fp32", 23, {0, 8192, 8200}, 0, 0, 1, 1, 128, 128, 4, true, kB16,
                                  kF32, false);
    // The simple kernel (other head sizes, fp32 inputs).
    default: return make_pool_case("simple_fp32", 24, {0, 33, 130, 131}, 0, 0, 1, 3, 40, 24, 5, false, kF32, kF32,
                                   false);
  }
}

}  // namespace

std::vector<std::string> cpu_pool_case_names() {
  return {"varlen_kfirst_fp32", "varlen_vfirst_bf16_int64", "batch_kfirst_fp64"};
}
PoolCase cpu_pool_case(size_t i) { return cpu_case(i); }
std::vector<std::string> gpu_pool_case_names() {
  return {"tc_kfirst_fp32", "tc_vfirst_bf16", "tc_pieces_vfirst_fp32", "simple_fp32"};
}
PoolCase gpu_pool_case(size_t i) { return gpu_case(i); }

std::vector<int64_t> changed_rows(const HostTensor& before, const HostTensor& after, int64_t slots) {
  std::vector<int64_t> rows;
  const int64_t row = before.numel() / slots;
  for (int64_t s = 0; s < slots; ++s) {
    for (int64_t i = 0; i < row; ++i) {
      const double a = before.get_flat(s * row + i), b = after.get_flat(s * row + i);
      if (std::memcmp(&a, &b, sizeof a) != 0) {
        rows.push_back(s);
        break;
      }
    }
  }
  return rows;
}

}  // namespace flashqla_test
