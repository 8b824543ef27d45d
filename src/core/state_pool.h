// Host-side handling of the serving entry's slot indices (state_indices):
// sequence n reads and writes row state_indices[n] of the state pool.
#pragma once

#include <cstdint>
#include <vector>

#include "flashqla/flashqla.h"

namespace flashqla {

// Copies n indices from a host buffer of dtype int32 / int64.
std::vector<int64_t> read_state_indices(const void* data, flashqla_dtype_t dtype, int64_t n);

// Throws INVALID_ARGUMENT naming `what` unless every index is below `slots`
// and the non-negative ones are distinct (two sequences writing one slot
// would race).
void check_state_indices(const std::vector<int64_t>& indices, int64_t slots, const char* entry,
                         const char* what);

}  // namespace flashqla
