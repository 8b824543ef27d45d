// Host-side handling of sequence boundaries (cu_seqlens).
#pragma once

#include <cstdint>
#include <vector>

#include "flashqla/flashqla.h"

namespace flashqla {

// Copies N + 1 boundaries from a host buffer of dtype int32 / int64
// (element stride `stride`).
std::vector<int64_t> read_cu_seqlens(const void* data, flashqla_dtype_t dtype, int64_t n_plus_1,
                                     int64_t stride = 1);

// Throws INVALID_ARGUMENT naming `what` unless the boundaries start at 0,
// never decrease and end at T.
void check_cu_seqlens(const std::vector<int64_t>& cu, int64_t T, const char* entry,
                      const char* what);

// Boundaries [begin, end) of sequence n in tokens of batch row `batch_row`:
// varlen -> (cu[n], cu[n+1]) in row 0, else (0, T) in row n.
struct SequenceSpan {
  int64_t batch_row, begin, end;
  int64_t length() const { return end - begin; }
};

}  // namespace flashqla
