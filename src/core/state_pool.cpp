#include "core/state_pool.h"

#include <unordered_map>

#include "core/dtype.h"
#include "core/error.h"

namespace flashqla {

std::vector<int64_t> read_state_indices(const void* data, flashqla_dtype_t dtype, int64_t n) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = load_index(data, dtype, i);
  return idx;
}

void check_state_indices(const std::vector<int64_t>& indices, int64_t slots, const char* entry,
                         const char* what) {
  std::unordered_map<int64_t, size_t> first;  // slot -> the sequence that takes it
  for (size_t n = 0; n < indices.size(); ++n) {
    const int64_t slot = indices[n];
    FLASHQLA_REQUIRE(slot < slots, entry, ": ", what, "[", n, "] = ", slot,
                     ": must be below the pool's slot count initial_state_n = ", slots,
                     " (negative: start from zero, write nothing)");
    if (slot < 0) continue;
    const auto [it, fresh] = first.emplace(slot, n);
    FLASHQLA_REQUIRE(fresh, entry, ": ", what, ": sequences ", it->second, " and ", n,
                     " both take slot ", slot, "; the non-negative indices must be distinct");
  }
}

}  // namespace flashqla
