#include "core/sequences.h"

#include "core/dtype.h"
#include "core/error.h"

namespace flashqla {

std::vector<int64_t> read_cu_seqlens(const void* data, flashqla_dtype_t dtype, int64_t n_plus_1,
                                     int64_t stride) {
  std::vector<int64_t> cu(static_cast<size_t>(n_plus_1));
  for (int64_t i = 0; i < n_plus_1; ++i) cu[size_t(i)] = load_index(data, dtype, i * stride);
  return cu;
}

void check_cu_seqlens(const std::vector<int64_t>& cu, int64_t T, const char* entry,
                      const char* what) {
  FLASHQLA_REQUIRE(!cu.empty() && cu.front() == 0, entry, ": ", what,
                   ": must start at 0, got ", cu.empty() ? -1 : cu.front());
  for (size_t i = 1; i < cu.size(); ++i) {
    FLASHQLA_REQUIRE(cu[i] >= cu[i - 1], entry, ": ", what,
                     ": must be non-decreasing, got ", what, "[", i - 1, "] = ", cu[i - 1],
                     " > ", what, "[", i, "] = ", cu[i]);
  }
  FLASHQLA_REQUIRE(cu.back() == T, entry, ": ", what, ": must end at T = ", T, ", got ",
                   what, "[", cu.size() - 1, "] = ", cu.back());
}

}  // namespace flashqla
