// Tensor-memory-accelerator loads of 16-bit token tiles, completed on an
// mbarrier, and stores of them (o), and the host-side tensor map that
// describes them.
//
// A token tile is [64 tokens][128 features] of q, k or v for one (row, head),
// landed in shared memory as two column blocks of [64 tokens][64 features],
// 128-byte rows in the 128-byte swizzle: mma::Swizzled128Tile<T, 64>. The
// five-dimensional map that produces this order in one instruction:
//   dim 0: 64 features (contiguous), dim 1: tokens (token stride),
//   dim 2: 2 feature blocks (128 bytes), dim 3: heads, dim 4: batch rows,
// box (64, 64, 2, 1, 1), swizzle 128B (v); q and k take box (64, 64, 1, 1, 1),
// a load a feature block, so that each block lands where the kernel puts it
// (the fused kernel interleaves k's and q's blocks). The TMA unit moves whole 128-byte
// lines (a box of 16-byte rows, the core-matrix order, costs it 8 times the
// requests: docs/perf.md, v3.16). Tokens past the row's end (dim 1's extent) land as
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
// (1024-byte aligned) and signals `bar` with its bytes: the whole tile (16 KB)
// through a map of two-block boxes, or its 64-feature block `block` (8 KB)
// through a map of one-block boxes (encode_token_tile_map).
__device__ __forceinline__ void load_token_tile(void* dst, const CUtensorMap* map, uint64_t* bar, int token, int head,
                                                int row, int block = 0) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(mma::smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(mma::smem_addr(bar)), "r"(0), "r"(token), "r"(block), "r"(head),
      "r"(row)
      : "memory");
}

// Stores the [64 tokens][64 features] tile at `src` (mma::Swizzled128Tile,
// 1024-byte aligned) to o's features from `feature` of the tokens from
// `token` of (batch row, head), through encode_output_tile_map's map, as one
// bulk group. Tokens past the map's extent are not written.
__device__ __forceinline__ void store_output_tile(const CUtensorMap* map, const void* src, int feature, int token,
                                                  int head, int row) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
      "cp.async.bulk.commit_group;\n" ::"l"(reinterpret_cast<uint64_t>(map)),
      "r"(mma::smem_addr(src)), "r"(feature), "r"(token), "r"(head), "r"(row)
      : "memory");
}

// Waits until at most kPending of this thread's bulk store groups still read
// shared memory.
template <int kPending>
__device__ __forceinline__ void wait_stores_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}

// Waits until this thread's bulk stores are complete.
__device__ __forceinline__ void wait_stores_done() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

}  // namespace flashqla::cuda::tma
