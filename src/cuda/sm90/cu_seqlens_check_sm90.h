// Device-side check of cu_seqlens contents (the debug switch of the C API).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace flashqla::cuda {

// Bits of the result word written by the check.
enum CuSeqlensIssue : uint32_t {
  kCuSeqlensOk = 0,
  kCuSeqlensBadStart = 1u << 0,   // cu_seqlens[0] != 0
  kCuSeqlensDecreasing = 1u << 1, // some cu_seqlens[i] < cu_seqlens[i-1]
  kCuSeqlensBadEnd = 1u << 2,     // cu_seqlens[N] != T
};

// Enqueues the check of cu_seqlens[0..N] (int32 when !is_int64) against T;
// the result (a CuSeqlensIssue bit set) lands in *result (device memory),
// which the kernel zeroes itself first. Returns the launch status.
cudaError_t launch_check_cu_seqlens(const void* cu_seqlens, bool is_int64, int64_t N, int64_t T,
                                    uint32_t* result, cudaStream_t stream);

}  // namespace flashqla::cuda
