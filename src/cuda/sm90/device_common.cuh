// Device helpers shared by the forward and backward kernels: dtype-generic scalar
// loads and stores, cu_seqlens reads, the beta activation, state-tensor offsets
// and the simple kernels' chunk preparation.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "flashqla/flashqla.h"

namespace flashqla::cuda {

// Programmatic dependent launch (sm_90): wait until the grids this one depends on
// have completed and their writes are visible (a no-op in a plain launch), and
// let this grid's dependents be scheduled once every CTA has said so or exited.
__device__ __forceinline__ void wait_for_prerequisite_grids() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void allow_dependent_grids() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// Chained pieces' hand-over through a counter in global memory: the waiting
// threads read it with acquire semantics (their later loads see what was stored
// before the release), the signalling thread raises it with release semantics
// after a barrier that follows every writer's fence.
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// A wait that outlasts any piece by far (a broken hand-over) traps: the launch
// fails with an error instead of hanging the stream.
constexpr uint64_t kChainWaitLimitNs = 60ull * 1000 * 1000 * 1000;
__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void wait_until_at_least(const unsigned* counter, unsigned n) {
  if (load_acquire(counter) >= n) return;
  const uint64_t start = global_timer_ns();
  while (load_acquire(counter) < n) {
    __nanosleep(200);
    if (global_timer_ns() - start > kChainWaitLimitNs) __trap();
  }
}
__device__ __forceinline__ void add_release(unsigned* p, unsigned x) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(x) : "memory");
}
// Raises a count to at least x (two threads of a CTA may raise it, in either order).
__device__ __forceinline__ void max_release(unsigned* p, unsigned x) {
  asm volatile("red.release.gpu.global.max.u32 [%0], %1;" ::"l"(p), "r"(x) : "memory");
}

__device__ __forceinline__ float load_float(const void* p, flashqla_dtype_t dtype, int64_t i) {
  switch (dtype) {
    case FLASHQLA_DTYPE_BFLOAT16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case FLASHQLA_DTYPE_FLOAT16: return __half2float(static_cast<const __half*>(p)[i]);
    case FLASHQLA_DTYPE_FLOAT64: return static_cast<float>(static_cast<const double*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// Raw bits of a 16- or 32-bit float element (the load's result is not used
// until raw_to_float, so a load issued early does not stall the warp).
__device__ __forceinline__ uint32_t load_raw(const void* p, flashqla_dtype_t dtype, int64_t i) {
  if (dtype == FLASHQLA_DTYPE_FLOAT32) return static_cast<const uint32_t*>(p)[i];
  return static_cast<const uint16_t*>(p)[i];
}

// Every reading computed and one selected: straight-line code (a switch here
// put a branch region around each gate of the fused kernel's producer).
__device__ __forceinline__ float raw_to_float(uint32_t bits, flashqla_dtype_t dtype) {
  const float as_bf16 = __uint_as_float(bits << 16);
  const float as_f16 = __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  const float as_f32 = __uint_as_float(bits);
  return dtype == FLASHQLA_DTYPE_BFLOAT16 ? as_bf16 : dtype == FLASHQLA_DTYPE_FLOAT16 ? as_f16 : as_f32;
}

__device__ __forceinline__ void store_float(void* p, flashqla_dtype_t dtype, int64_t i, float x) {
  switch (dtype) {
    case FLASHQLA_DTYPE_BFLOAT16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(x); break;
    case FLASHQLA_DTYPE_FLOAT16: static_cast<__half*>(p)[i] = __float2half(x); break;
    case FLASHQLA_DTYPE_FLOAT64: static_cast<double*>(p)[i] = x; break;
    default: static_cast<float*>(p)[i] = x; break;
  }
}

// Whether an output's adjacent elements i, i + 1 (i even) can go as one 32-bit
// bf16 pair: bf16, the base 4-byte aligned and every stride even.
__device__ __forceinline__ bool bf16_pairs(const void* p, flashqla_dtype_t dtype, int64_t s0, int64_t s1, int64_t s2) {
  return dtype == FLASHQLA_DTYPE_BFLOAT16 && reinterpret_cast<uintptr_t>(p) % 4 == 0 && (s0 | s1 | s2) % 2 == 0;
}

// Elements i and i + 1 (i even): one packed store where pairs (bf16_pairs),
// else two.
__device__ __forceinline__ void store_float_pair(void* p, flashqla_dtype_t dtype, int64_t i, float x0, float x1,
                                                 bool pairs) {
  if (pairs) {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p) + i) = __floats2bfloat162_rn(x0, x1);
    return;
  }
  store_float(p, dtype, i, x0);
  store_float(p, dtype, i + 1, x1);
}

__device__ __forceinline__ int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }
__device__ __forceinline__ int64_t max64(int64_t x, int64_t y) { return x > y ? x : y; }

__device__ __forceinline__ int64_t load_index(const void* p, bool is_int64, int64_t i) {
  return is_int64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

// Token range [bos, eos) of sequence n. cu_seqlens contents are clamped into
// [0, T] so a kernel stays in bounds whatever they hold (validation reports
// invalid contents where it can read them).
struct SequenceRange {
  int64_t row, bos, eos;
};

__device__ __forceinline__ SequenceRange sequence_range(const void* cu_seqlens, bool is_int64, int64_t T,
                                                        int64_t n) {
  if (cu_seqlens == nullptr) return {n, 0, T};
  const int64_t bos = min64(max64(load_index(cu_seqlens, is_int64, n), 0), T);
  const int64_t eos = min64(max64(load_index(cu_seqlens, is_int64, n + 1), bos), T);
  return {0, bos, eos};
}

__device__ __forceinline__ float activate_beta(float b, int activation) {
  const float s = __fdividef(1.f, 1.f + __expf(-b));  // computed either way: no branch
  return activation == FLASHQLA_BETA_IDENTITY ? b : activation == FLASHQLA_BETA_SIGMOID_X2 ? 2.f * s : s;
}

// d activate_beta / d b. The sigmoid's derivative as σ(b) σ(−b), each factor
// from its own exponential: σ(b) (1 − σ(b)) loses 1 − σ(b) to rounding once
// σ(b) rounds to 1 (b ≳ 17 in fp32), and returns 0 for a gradient that is
// small but not zero.
__device__ __forceinline__ float activate_beta_grad(float b, int activation) {
  if (activation == FLASHQLA_BETA_IDENTITY) return 1.f;
  const float d = 1.f / ((1.f + expf(-b)) * (1.f + expf(b)));
  return activation == FLASHQLA_BETA_SIGMOID_X2 ? 2.f * d : d;
}

// The row of sequence n's initial and final state: n itself, or with a state
// pool (state_indices given) its slot; -1 for none (a negative slot, or one
// past the pool, which the host could not check: the sequence starts from
// zero and writes no final state).
__device__ __forceinline__ int64_t state_row(const void* state_indices, bool is_int64, int64_t pool_slots,
                                             int64_t n) {
  if (state_indices == nullptr) return n;
  const int64_t slot = load_index(state_indices, is_int64, n);
  return slot >= 0 && slot < pool_slots ? slot : -1;
}

// The simple kernels' chunk preparation, on fp32 rows of a chunk in shared
// memory (row stride ld): rows r < L of q and k times rsqrt(Σx² + 1e-6), one
// warp a row, as the forward normalises (kThreads: the CTA's threads, every
// one calling).
template <int kThreads>
__device__ __forceinline__ void normalize_qk_rows_fp32(float* q, float* k, int L, int64_t K, int64_t ld) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int r = warp; r < L; r += kThreads / 32) {
    for (int which = 0; which < 2; ++which) {
      float* m = which == 0 ? q : k;
      float ss = 0.f;
      for (int64_t x = lane; x < K; x += 32) ss += m[r * ld + x] * m[r * ld + x];
      for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
      const float rs = rsqrtf(ss + 1e-6f);
      for (int64_t x = lane; x < K; x += 32) m[r * ld + x] *= rs;
    }
  }
}

// gamma[0 .. kChunk) becomes its inclusive cumsum over the chunk's L rows, the
// padded rows repeating the last value (one thread).
template <int kChunk>
__device__ __forceinline__ void chunk_cumsum_serial(float* gamma, int L) {
  float acc = 0.f;
  for (int r = 0; r < kChunk; ++r) gamma[r] = (acc += r < L ? gamma[r] : 0.f);
}

// Offset of state element (key x, value c) of sequence n, value head hv, in a
// [N, HV, K, V] (or, v_first, [N, HV, V, K]) tensor with the given strides.
__device__ __forceinline__ int64_t state_offset(int64_t n, int64_t hv, int64_t x, int64_t c, int64_t sn,
                                                int64_t sh, int64_t s2, int64_t s3, bool v_first) {
  return n * sn + hv * sh + (v_first ? c * s2 + x * s3 : x * s2 + c * s3);
}

}  // namespace flashqla::cuda
