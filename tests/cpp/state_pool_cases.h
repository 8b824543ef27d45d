// Cases of the serving entry (state_indices): a state pool of more slots than
// sequences, filled with random states, random distinct slots with -1 among
// them, the pool read and written in place. The expected result comes from
// the plain forward on the CPU in fp64 (each sequence's initial state copied
// out of its slot, zero for -1): o, and the pool with each slot a sequence
// took replaced by that sequence's final state, every other row unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "test_support.h"

namespace flashqla_test {

struct PoolCase {
  std::string name;
  GdnCase c;                     // inputs and o; c.h0 / c.ht unused
  int64_t slots = 0;
  std::vector<int64_t> indices;  // [N]: distinct slots, or -1
  HostTensor pool;               // [slots, HV, K, V] (or V-first), pool dtype
  HostTensor index_tensor;       // [N] int32 / int64
  HostTensor expected_o;         // fp64
  HostTensor expected_pool;      // pool dtype: what the pool must hold after the call

  // Params of the pooled call on the CPU backend over this case's host
  // tensors (pool in place: initial_state and final_state both the pool).
  flashqla_gdn_fwd_params_t params();
};

// `p` turned into the pooled call: initial_state and final_state both the
// pool (an update in place), state_indices the slots.
flashqla_gdn_fwd_params_t pooled_params(flashqla_gdn_fwd_params_t p, const flashqla_tensor_t& pool,
                                        const flashqla_tensor_t& indices, int64_t slots);

// A case: cu_seqlens (empty: B rows of T tokens), slots in the pool, the
// pool's layout and dtype, the indices' dtype; seeded.
PoolCase make_pool_case(const std::string& name, uint64_t seed, std::vector<int64_t> cu_seqlens, int64_t B,
                        int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V, int64_t slots, bool v_first,
                        flashqla_dtype_t token_dtype, flashqla_dtype_t pool_dtype, bool int64_indices);

// The named cases of each suite (the GPU's with bf16 inputs and K = V = 128
// among them): their names, and case i built (inputs, the CPU reference).
std::vector<std::string> cpu_pool_case_names();
PoolCase cpu_pool_case(size_t i);
std::vector<std::string> gpu_pool_case_names();
PoolCase gpu_pool_case(size_t i);

// Pool rows whose bytes differ from `before` (row: slot, all heads), for
// checking that rows no sequence took are untouched.
std::vector<int64_t> changed_rows(const HostTensor& before, const HostTensor& after, int64_t slots);

}  // namespace flashqla_test
