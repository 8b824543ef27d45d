// Warpgroup tensor-core building blocks (sm_90a): wgmma m64nNk16 with A from
// registers (the mma.sync A-fragment layout, one 16-row slice per warp) and B
// from shared memory in the K-major, non-swizzled core-matrix layout; fp32
// accumulators in the mma.sync C layout repeated over the N / 8 n8 tiles
// (d[4 j + e]: row 16 warp + g + 8 (e / 2), column 8 j + 2 t + e % 2).
//
// B layout ("interleave", K-major): 8x8 core matrices of 8 N-rows x 8 K-elements,
// each row 16 contiguous bytes; core matrices adjacent in K are `lbo` bytes
// apart, those adjacent in N `sbo` bytes apart — mma::CoreTile with rows = N.
#pragma once

#include <cstdint>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/arch/mma_sm90.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include "cuda/sm90/warp_mma.cuh"

namespace flashqla::cuda::wgmma {

// layout_type: 0 no swizzle ("interleave"), 1 the 128-byte swizzle.
__device__ __forceinline__ uint64_t make_desc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                              uint8_t layout_type = 0) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>(static_cast<uint32_t>(__cvta_generic_to_shared(smem)) >> 4);
  d.bitfield.leading_byte_offset_ = static_cast<uint16_t>(lbo_bytes >> 4);
  d.bitfield.stride_byte_offset_ = static_cast<uint16_t>(sbo_bytes >> 4);
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = layout_type;
  return d.desc_;
}

// The descriptor of `p`, an address inside the operand whose descriptor at
// `base` is `base_desc`: the start address field holds the shared-memory byte
// address / 16 in its low 14 bits (shared memory < 256 KB: no carry out of
// them), so a constant offset is one add instead of a new descriptor (which
// the compiler then builds once a tile, not once a wgmma).
__device__ __forceinline__ uint64_t offset_desc(uint64_t base_desc, const void* base, const void* p) {
  return base_desc + static_cast<uint64_t>((static_cast<const char*>(p) - static_cast<const char*>(base)) >> 4);
}

// Descriptor of a CoreTile [N rows][K columns] read as the K-major operand,
// from column k0 and row n0, a multiple of 8 (core matrices adjacent in K: 128
// bytes; row blocks: kCols * 16).
template <typename T, int kCols>
__device__ __forceinline__ uint64_t kmajor_desc(const mma::CoreTile<T, kCols>& tile, int k0, int n0 = 0) {
  return offset_desc(make_desc(tile.base, 128, kCols * 16), tile.base, tile.at(n0, k0));
}

// Descriptor of a CoreTile [K rows][MN columns] read as an MN-major operand
// (B, or A from shared memory), from row k0 and column mn0: core matrices
// adjacent in MN are 128 bytes apart (SBO), 8-row blocks adjacent in K
// kCols * 16 bytes (LBO) — the non-swizzled MN-major canonical layout
// ((8,1,n),(8,k)):((1,8,SBO),(8,LBO)) in elements.
template <typename T, int kCols>
__device__ __forceinline__ uint64_t mnmajor_desc(const mma::CoreTile<T, kCols>& tile, int k0, int mn0 = 0) {
  return offset_desc(make_desc(tile.base, kCols * 16, 128), tile.base, tile.at(k0, mn0));
}

// The same two for a Swizzled128Tile [kRows][..] (128-byte swizzle; k0 and
// n0 / mn0 such that the start is a chunk of an unpermuted row, i.e. rows a
// multiple of 8). K-major: 8-row groups 1024 bytes apart (SBO), K steps of 16
// are 32 bytes inside a 128-byte row, the next 64 columns the next column
// block (LBO unused). MN-major: 8-row (K) groups 1024 bytes apart (SBO),
// column blocks (64 MN) kRows * 128 bytes apart (LBO).
template <typename T, int kRows>
__device__ __forceinline__ uint64_t kmajor_desc(const mma::Swizzled128Tile<T, kRows>& tile, int k0, int n0 = 0) {
  return offset_desc(make_desc(tile.base, 16, 1024, 1), tile.base, tile.at(n0, k0));
}
template <typename T, int kRows>
__device__ __forceinline__ uint64_t mnmajor_desc(const mma::Swizzled128Tile<T, kRows>& tile, int k0, int mn0 = 0) {
  return offset_desc(make_desc(tile.base, kRows * 128, 1024, 1), tile.base, tile.at(k0, mn0));
}

// CuTe's name of a 16-bit element type.
template <typename T>
struct CuteElement;
template <>
struct CuteElement<__nv_bfloat16> {
  using type = cute::bfloat16_t;
};
template <>
struct CuteElement<__half> {
  using type = cute::half_t;
};

// The m64nNk16 instruction for 16-bit T and fp32 accumulators, as CuTe's
// selectors name it: A from registers (K-major) or, OpSS, from shared memory.
template <int N>
using TileShape = cute::Shape<cute::_64, cute::Int<N>, cute::_16>;
template <typename T, int N, cute::SM90::GMMA::Major B>
using Op = decltype(cute::SM90::GMMA::rs_op_selector<typename CuteElement<T>::type, typename CuteElement<T>::type, float,
                                                     TileShape<N>, cute::SM90::GMMA::Major::K, B>());
template <typename T, int N, cute::SM90::GMMA::Major A, cute::SM90::GMMA::Major B>
using OpSS = decltype(cute::SM90::GMMA::ss_op_selector<typename CuteElement<T>::type, typename CuteElement<T>::type,
                                                       float, TileShape<N>, A, B>());

template <typename T, int N, cute::SM90::GMMA::Major B, size_t... I>
__device__ __forceinline__ void mma_impl(const uint32_t (&a)[4], uint64_t desc_b, float (&d)[N / 2],
                                         std::index_sequence<I...>) {
  Op<T, N, B>::fma(a[0], a[1], a[2], a[3], desc_b, d[I]...);
}

// d += A (64x16, registers) B (16xN, shared memory), N = 32, 64 or 128 (N / 2
// accumulators a thread), B K-major (kmajor_desc); asynchronous until commit_and_wait().
template <typename T, int N>
__device__ __forceinline__ void mma(const uint32_t (&a)[4], uint64_t desc_b, float (&d)[N / 2]) {
  mma_impl<T, N, cute::SM90::GMMA::Major::K>(a, desc_b, d, std::make_index_sequence<N / 2>{});
}

// The same with B MN-major (mnmajor_desc).
template <typename T, int N>
__device__ __forceinline__ void mma_b_mn(const uint32_t (&a)[4], uint64_t desc_b, float (&d)[N / 2]) {
  mma_impl<T, N, cute::SM90::GMMA::Major::MN>(a, desc_b, d, std::make_index_sequence<N / 2>{});
}

template <typename T, int N, cute::SM90::GMMA::Major A, cute::SM90::GMMA::Major B, size_t... I>
__device__ __forceinline__ void mma_ss_impl(uint64_t desc_a, uint64_t desc_b, float (&d)[N / 2],
                                            std::index_sequence<I...>) {
  OpSS<T, N, A, B>::fma(desc_a, desc_b, d[I]...);
}

// d += A (64x16) B (16xN), both from shared memory (A: kmajor_desc or
// mnmajor_desc of a [M][K] or [K][M] tile; B as above).
template <typename T, int N, cute::SM90::GMMA::Major A, cute::SM90::GMMA::Major B>
__device__ __forceinline__ void mma_ss(uint64_t desc_a, uint64_t desc_b, float (&d)[N / 2]) {
  mma_ss_impl<T, N, A, B>(desc_a, desc_b, d, std::make_index_sequence<N / 2>{});
}
constexpr auto kK = cute::SM90::GMMA::Major::K;
constexpr auto kMN = cute::SM90::GMMA::Major::MN;

// Keeps the compiler from moving accesses of accumulators across a batch.
template <int R>
__device__ __forceinline__ void fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) cute::warpgroup_fence_operand(d[i]);
}

// Register writes (accumulators, A fragments) before the first mma of a batch.
__device__ __forceinline__ void arrive() { cute::warpgroup_arrive(); }

template <int R>
__device__ __forceinline__ void fence(float (&d)[R]) {
  fence_operands(d);
  arrive();
}

// Closes the batch of wgmmas issued since the last commit.
__device__ __forceinline__ void commit() { cute::warpgroup_commit_batch(); }

// Waits until at most kPending committed batches are in flight.
template <int kPending>
__device__ __forceinline__ void wait() {
  cute::warpgroup_wait<kPending>();
}

// Issue the batch and wait for it; fence the accumulators of every mma in it
// (fence_operands) before reading them.
__device__ __forceinline__ void commit_and_wait() {
  cute::warpgroup_commit_batch();
  cute::warpgroup_wait<0>();
}

template <int R>
__device__ __forceinline__ void commit_and_wait(float (&d)[R]) {
  commit_and_wait();
  fence_operands(d);
}

// Generic-proxy shared-memory writes made visible to wgmma (before a barrier).
__device__ __forceinline__ void fence_shared_for_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

}  // namespace flashqla::cuda::wgmma
