// Bulk stores (the tensor memory accelerator's non-tensor copies) from shared
// to global memory: one instruction copies a contiguous run of bytes, both
// ends 16-byte aligned, its size a multiple of 16. The issuing thread tracks
// its copies in bulk groups; before the shared source is written again, it
// waits until the group's reads are done (wait_reads) and passes that on
// through a barrier. Writes to the source before the copy need
// fence.proxy.async (the copy reads through the async proxy).
#pragma once

#include <cstdint>

#include "cuda/sm90/warp_mma.cuh"

namespace flashqla::cuda::bulk {

__device__ __forceinline__ void store(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(reinterpret_cast<uint64_t>(dst)),
               "r"(mma::smem_addr(src)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Every committed group of this thread has finished reading its shared source.
__device__ __forceinline__ void wait_reads() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }

}  // namespace flashqla::cuda::bulk
