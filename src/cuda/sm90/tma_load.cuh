// Tensor-memory-accelerator loads of 16-bit token tiles, completed on an
// mbarrier, and the host-side tensor map that describes them.
//
// A token tile is [64 tokens][128 features] of q, k or v for one (row, head),
// landed in shared memory as core matrices (8 tokens x 8 features, 128
// contiguous bytes) column block outermost: mma::ColumnBlockTile<T, 64>. The
// five-dimensional map that produces this order in one instruction:
//   dim 0: 8 features (contiguous), dim 1: tokens (token stride),
//   dim 2: 16 feature blocks (16 bytes), dim 3: heads, dim 4: batch rows,
// box (8, 64, 16, 1, 1). Tokens past the row's end (dim 1's extent) land as
// zeros; for packed variable-length batches the rows past a sequence's end
// hold the next sequence's tokens, which the kernel zeroes itself.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/sm90/warp_mma.cuh"

namespace flashqla::cuda::tma {

constexpr int kTileTokens = 64;
constexpr int kTileFeatures = 128;

__device__ __forceinline__ void barrier_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mma::smem_addr(bar)), "r"(arrivals) : "memory");
}

// Makes the barriers' initialization visible to the async proxy (before a CTA barrier).
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also expects `bytes` of transactions (the loads' bytes) on the barrier.
__device__ __forceinline__ void arrive_expect_bytes(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(mma::smem_addr(bar)), "r"(bytes)
               : "memory");
}

// Waits for the completion of the barrier's phase of parity `parity`.
__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra.uni WAIT_LOOP;\n"
      "}\n" ::"r"(mma::smem_addr(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Loads the token tile of (batch row, head) starting at `token` into `dst`
// (16 KB, 128-byte aligned) and signals `bar` with its bytes.
__device__ __forceinline__ void load_token_tile(void* dst, const CUtensorMap* map, uint64_t* bar, int token, int head,
                                                int row) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(mma::smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(mma::smem_addr(bar)), "r"(0), "r"(token), "r"(0), "r"(head), "r"(row)
      : "memory");
}

}  // namespace flashqla::cuda::tma
