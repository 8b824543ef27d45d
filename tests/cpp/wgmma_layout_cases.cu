#include "wgmma_layout_cases.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <random>

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include "cuda/sm90/warp_mma.cuh"
#include "cuda/sm90/warpgroup_mma.cuh"

namespace flashqla_test {
namespace {

constexpr int kM = 64, kN = 128, kK = 64;

// kKMajorSw128 / kMNMajorSw128: the 128-byte swizzled layouts, described by the
// kernels' own wgmma::kmajor_desc / mnmajor_desc of an mma::Swizzled128Tile (as
// TMA lands q, k, v). kKMajorColumnBlocks / kMNMajorColumnBlocks: the same core
// matrices as kKMajor / kMNMajor with the tile's column blocks outermost (the
// order a box of 16-byte rows lands in): K-blocks (K-major) or MN-blocks
// (MN-major) a whole column of core matrices apart.
enum Layout { kKMajor, kMNMajor, kKMajorSw128, kMNMajorSw128, kKMajorColumnBlocks, kMNMajorColumnBlocks, kRegisters };

// Byte offset of element (mn, k) of an operand with MN extent `mn_ext` (M for A,
// N for B) in each layout, and the descriptor fields for k-step s (16 wide).
struct Operand {
  Layout layout;
  int mn_ext;
  __host__ __device__ int offset(int mn, int k) const {
    switch (layout) {
      case kKMajor:  // 8x8 core matrices: 8 MN-rows of 8 contiguous K; K-blocks 128 B apart
        return (mn >> 3) * (kK * 16) + (k >> 3) * 128 + (mn & 7) * 16 + (k & 7) * 2;
      case kMNMajor:  // 8x8 core matrices: 8 K-rows of 8 contiguous MN; MN-blocks 128 B apart
        return (k >> 3) * (mn_ext * 16) + (mn >> 3) * 128 + (k & 7) * 16 + (mn & 7) * 2;
      case kKMajorSw128:  // 8 rows x 128 B atoms, 16-byte chunks XOR row
        return (k >> 6) * (mn_ext * 128) + (mn >> 3) * 1024 + (mn & 7) * 128 +
               ((((k >> 3) & 7) ^ (mn & 7)) << 4) + (k & 7) * 2;
      case kMNMajorSw128:  // 8 K-rows x 64 MN atoms, 16-byte chunks XOR K-row
        return (mn >> 6) * (kK / 8 * 1024) + (k >> 3) * 1024 + (k & 7) * 128 +
               ((((mn >> 3) & 7) ^ (k & 7)) << 4) + (mn & 7) * 2;
      case kKMajorColumnBlocks:  // [mn][k] tile: MN-blocks 128 B apart, K-blocks mn_ext * 16 B apart
        return (k >> 3) * (mn_ext * 16) + (mn >> 3) * 128 + (mn & 7) * 16 + (k & 7) * 2;
      case kMNMajorColumnBlocks:  // [k][mn] tile: K-blocks 128 B apart, MN-blocks kK * 16 B apart
        return (mn >> 3) * (kK * 16) + (k >> 3) * 128 + (k & 7) * 16 + (mn & 7) * 2;
      default:  // padded row-major [mn][k], for ldmatrix
        return (mn * (kK + 8) + k) * 2;
    }
  }
  __device__ uint64_t desc(const unsigned char* tile, int s) const {
    namespace wg = flashqla::cuda::wgmma;
    using flashqla::cuda::mma::Swizzled128Tile;
    auto* p = reinterpret_cast<__nv_bfloat16*>(const_cast<unsigned char*>(tile));
    if (layout == kKMajorSw128)  // [mn][k] rows of the tile: kRows = the MN extent
      return mn_ext == kM ? wg::kmajor_desc(Swizzled128Tile<__nv_bfloat16, kM>{p}, 16 * s)
                          : wg::kmajor_desc(Swizzled128Tile<__nv_bfloat16, kN>{p}, 16 * s);
    if (layout == kMNMajorSw128)  // [k][mn]: kRows = K
      return wg::mnmajor_desc(Swizzled128Tile<__nv_bfloat16, kK>{p}, 16 * s);
    cute::GmmaDescriptor d;
    int start = 0, lbo = 16, sbo = 16;
    switch (layout) {
      case kKMajor: start = s * 256, lbo = 128, sbo = kK * 16; break;
      case kMNMajor: start = s * 2 * mn_ext * 16, lbo = mn_ext * 16, sbo = 128; break;
      // LBO the K-direction step between core matrices, SBO the MN-direction one.
      case kKMajorColumnBlocks: start = s * 2 * mn_ext * 16, lbo = mn_ext * 16, sbo = 128; break;
      case kMNMajorColumnBlocks: start = s * 256, lbo = 128, sbo = kK * 16; break;
      default: break;
    }
    d.bitfield.start_address_ = static_cast<uint16_t>((static_cast<uint32_t>(__cvta_generic_to_shared(tile)) + start) >> 4);
    d.bitfield.leading_byte_offset_ = static_cast<uint16_t>(lbo >> 4);
    d.bitfield.stride_byte_offset_ = static_cast<uint16_t>(sbo >> 4);
    d.bitfield.base_offset_ = 0;
    d.bitfield.layout_type_ = 0;
    return d.desc_;
  }
};

constexpr int kTileBytes = 16 * 1024;  // per operand, 1024-byte aligned

template <cute::SM90::GMMA::Major MajorA, cute::SM90::GMMA::Major MajorB, size_t... I>
__device__ void mma_ss(uint64_t da, uint64_t db, float (&d)[64], std::index_sequence<I...>) {
  cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<MajorA, MajorB>::fma(da, db, d[I]...);
}
template <cute::SM90::GMMA::Major MajorB, size_t... I>
__device__ void mma_rs(const uint32_t (&a)[4], uint64_t db, float (&d)[64], std::index_sequence<I...>) {
  cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K, MajorB>::fma(a[0], a[1], a[2], a[3], db,
                                                                                          d[I]...);
}

template <cute::SM90::GMMA::Major MajorA, cute::SM90::GMMA::Major MajorB>
__global__ void __launch_bounds__(128) gemm_kernel(const float* a, const float* b, float* out, Operand oa,
                                                   Operand ob) {
  __shared__ __align__(1024) unsigned char sa[kTileBytes];
  __shared__ __align__(1024) unsigned char sb[kTileBytes];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int i = tid; i < kM * kK; i += 128) {
    const int m = i / kK, k = i % kK;
    *reinterpret_cast<__nv_bfloat16*>(sa + oa.offset(m, k)) = __float2bfloat16(a[i]);
  }
  for (int i = tid; i < kK * kN; i += 128) {
    const int k = i / kN, n = i % kN;
    *reinterpret_cast<__nv_bfloat16*>(sb + ob.offset(n, k)) = __float2bfloat16(b[i]);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float d[64];
  for (int i = 0; i < 64; ++i) d[i] = 0.f;
  for (int i = 0; i < 64; ++i) cute::warpgroup_fence_operand(d[i]);
  cute::warpgroup_arrive();
  for (int s = 0; s < kK / 16; ++s) {
    if (oa.layout == kRegisters) {
      uint32_t af[4];
      const flashqla::cuda::mma::PaddedTile<const __nv_bfloat16> tile{reinterpret_cast<const __nv_bfloat16*>(sa), kK + 8};
      flashqla::cuda::mma::load_a(af, tile, 16 * warp, 16 * s, lane);
      cute::warpgroup_arrive();
      mma_rs<MajorB>(af, ob.desc(sb, s), d, std::make_index_sequence<64>{});
    } else {
      mma_ss<MajorA, MajorB>(oa.desc(sa, s), ob.desc(sb, s), d, std::make_index_sequence<64>{});
    }
  }
  cute::warpgroup_commit_batch();
  cute::warpgroup_wait<0>();
  for (int i = 0; i < 64; ++i) cute::warpgroup_fence_operand(d[i]);
  const int g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 64; ++i) {
    const int row = 16 * warp + g + ((i >> 1) & 1) * 8, col = 8 * (i >> 2) + 2 * t + (i & 1);
    out[row * kN + col] = d[i];
  }
}

struct Case {
  const char* name;
  Layout a, b;
};
constexpr Case kCases[] = {
    {"A_registers__B_kmajor", kRegisters, kKMajor},
    {"A_kmajor__B_kmajor", kKMajor, kKMajor},
    {"A_mnmajor__B_kmajor", kMNMajor, kKMajor},
    {"A_kmajor__B_mnmajor", kKMajor, kMNMajor},
    {"A_kmajor_sw128__B_kmajor_sw128", kKMajorSw128, kKMajorSw128},
    {"A_mnmajor_sw128__B_mnmajor_sw128", kMNMajorSw128, kMNMajorSw128},
    {"A_registers__B_mnmajor_sw128", kRegisters, kMNMajorSw128},
    {"A_registers__B_mnmajor", kRegisters, kMNMajor},
    {"A_kmajor_colblocks__B_kmajor_colblocks", kKMajorColumnBlocks, kKMajorColumnBlocks},
    {"A_kmajor__B_mnmajor_colblocks", kKMajor, kMNMajorColumnBlocks},
    {"A_registers__B_mnmajor_colblocks", kRegisters, kMNMajorColumnBlocks},
};

bool mn_major(Layout l) { return l == kMNMajor || l == kMNMajorSw128 || l == kMNMajorColumnBlocks; }

}  // namespace

std::vector<std::string> wgmma_layout_case_names() {
  std::vector<std::string> names;
  for (const Case& c : kCases) names.emplace_back(c.name);
  return names;
}

WgmmaLayoutResult run_wgmma_layout_case(int index) {
  using cute::SM90::GMMA::Major;
  const Case& c = kCases[index];
  WgmmaLayoutResult r;
  r.name = c.name;
  std::mt19937 rng(1000 + index);
  std::normal_distribution<float> nd;
  std::vector<float> a(kM * kK), b(kK * kN), out(kM * kN, NAN);
  for (float& x : a) x = __bfloat162float(__float2bfloat16(nd(rng)));
  for (float& x : b) x = __bfloat162float(__float2bfloat16(nd(rng)));
  float *da = nullptr, *db = nullptr, *dout = nullptr;
  cudaMalloc(&da, a.size() * 4);
  cudaMalloc(&db, b.size() * 4);
  cudaMalloc(&dout, out.size() * 4);
  cudaMemcpy(da, a.data(), a.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 4, cudaMemcpyHostToDevice);
  cudaMemset(dout, 0xFF, out.size() * 4);
  const Operand oa{c.a, kM}, ob{c.b, kN};
  const bool ta = mn_major(c.a), tb = mn_major(c.b);
  if (ta && tb) gemm_kernel<Major::MN, Major::MN><<<1, 128>>>(da, db, dout, oa, ob);
  if (ta && !tb) gemm_kernel<Major::MN, Major::K><<<1, 128>>>(da, db, dout, oa, ob);
  if (!ta && tb) gemm_kernel<Major::K, Major::MN><<<1, 128>>>(da, db, dout, oa, ob);
  if (!ta && !tb) gemm_kernel<Major::K, Major::K><<<1, 128>>>(da, db, dout, oa, ob);
  cudaError_t err = cudaDeviceSynchronize();
  if (err == cudaSuccess) err = cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) r.error = cudaGetErrorString(err);
  cudaFree(da);
  cudaFree(db);
  cudaFree(dout);
  double max_ref = 0, max_diff = 0;
  for (int m = 0; m < kM; ++m) {
    for (int n = 0; n < kN; ++n) {
      double ref = 0;
      for (int k = 0; k < kK; ++k) ref += double(a[m * kK + k]) * b[k * kN + n];
      max_ref = std::fmax(max_ref, std::fabs(ref));
      const double diff = std::fabs(out[m * kN + n] - ref);
      max_diff = std::isnan(diff) ? INFINITY : std::fmax(max_diff, diff);
    }
  }
  r.max_rel_error = max_diff / max_ref;
  return r;
}

}  // namespace flashqla_test
