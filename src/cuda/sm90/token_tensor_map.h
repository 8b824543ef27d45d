// Host side of the fused forward's TMA loads: the tensor map of q, k or v
// (tma_load.cuh describes its five dimensions and the tile it lands).
// cuTensorMapEncodeTiled comes from the driver through the runtime's entry
// point query, so nothing links libcuda.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashqla/flashqla.h"

namespace flashqla::cuda {

using EncodeTiledFn = PFN_cuTensorMapEncodeTiled_v12000;

inline EncodeTiledFn encode_tiled_entry() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return static_cast<EncodeTiledFn>(nullptr);
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// What both maps below share: the 16-bit element type, a dimension's stride in
// bytes (a dimension of extent 1 is never stepped along; its stride only has
// to be valid) and extents of at least 1.
inline CUtensorMapDataType token_map_type(flashqla_dtype_t dtype) {
  return dtype == FLASHQLA_DTYPE_BFLOAT16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}
inline cuuint64_t token_map_stride_bytes(int64_t extent, int64_t stride) {
  return static_cast<cuuint64_t>(extent > 1 ? stride * 2 : 16);
}
inline cuuint64_t token_map_extent(int64_t n) { return static_cast<cuuint64_t>(n > 0 ? n : 1); }

// The map of a [rows][tokens][heads][128] 16-bit tensor with element strides
// (row, token, head) and a contiguous last dimension, for tiles of 64 tokens
// and 128 features (q, k and v's loads): a box of both 64-feature blocks
// (feature_blocks = 2, one load a tile) or of one (1, a load a block, each
// block landed where the kernel wants it). Returns cudaErrorInvalidValue where
// the driver refuses it (or is too old).
inline cudaError_t encode_token_tile_map(CUtensorMap* map, const void* base, flashqla_dtype_t dtype, int64_t rows,
                                         int64_t tokens, int64_t heads, int64_t row_stride, int64_t token_stride,
                                         int64_t head_stride, int feature_blocks = 2) {
  const EncodeTiledFn encode = encode_tiled_entry();
  if (encode == nullptr) return cudaErrorInvalidValue;
  const CUtensorMapDataType type = token_map_type(dtype);
  const cuuint64_t dims[5] = {64, token_map_extent(tokens), 2, token_map_extent(heads), token_map_extent(rows)};
  const cuuint64_t strides[4] = {token_map_stride_bytes(tokens, token_stride), 128,
                                 token_map_stride_bytes(heads, head_stride), token_map_stride_bytes(rows, row_stride)};
  const cuuint32_t box[5] = {64, 64, static_cast<cuuint32_t>(feature_blocks), 1, 1};
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r = encode(map, type, 5, const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The map of o, a [rows][tokens][heads][128] 16-bit tensor as above, for
// tiles of 64 tokens and 64 features (a state warpgroup's half) in the
// 128-byte swizzled layout (tma_load.cuh, store_output_tile): each box row is
// 128 contiguous bytes of o, written by the TMA unit as whole lines.
inline cudaError_t encode_output_tile_map(CUtensorMap* map, const void* base, flashqla_dtype_t dtype, int64_t rows,
                                          int64_t tokens, int64_t heads, int64_t row_stride, int64_t token_stride,
                                          int64_t head_stride) {
  const EncodeTiledFn encode = encode_tiled_entry();
  if (encode == nullptr) return cudaErrorInvalidValue;
  const CUtensorMapDataType type = token_map_type(dtype);
  const cuuint64_t dims[4] = {128, token_map_extent(tokens), token_map_extent(heads), token_map_extent(rows)};
  const cuuint64_t strides[3] = {token_map_stride_bytes(tokens, token_stride),
                                 token_map_stride_bytes(heads, head_stride), token_map_stride_bytes(rows, row_stride)};
  const cuuint32_t box[4] = {64, 64, 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, type, 4, const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace flashqla::cuda
