// Building blocks of warp-specialised sm_90 kernels: named barriers declared
// with the ids they use and the threads that join them, the register split
// between warpgroups (setmaxnreg), hand-overs on mbarriers between warp roles
// that reach them at different instructions, and the (stage, phase) of a
// multi-stage pipeline on mbarriers.
#pragma once

#include <cstdint>

namespace flashqla::cuda::ws {

// Named barriers kFirst .. kFirst + kCount − 1 (one a stage where kCount > 1),
// each joined by kThreads threads. Id 0 is __syncthreads's; a kernel declares
// its barriers as types and checks they do not overlap (named_barriers_disjoint),
// so no barrier silently covers another's id.
template <int kFirst, int kCount, int kThreads>
struct NamedBarrier {
  static constexpr int first = kFirst, count = kCount, threads = kThreads;
  __device__ __forceinline__ static void sync(int instance = 0) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(kFirst + instance), "r"(kThreads) : "memory");
  }
  __device__ __forceinline__ static void arrive(int instance = 0) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(kFirst + instance), "r"(kThreads) : "memory");
  }
};

constexpr int kNamedBarrierIds = 16;

// Whether the barriers, listed in id order, use ids 1..15 without overlap.
template <typename... Barriers>
constexpr bool named_barriers_disjoint() {
  int next = 1;
  bool ok = true;
  ((ok = ok && Barriers::first >= next && Barriers::count >= 1 && Barriers::threads % 32 == 0,
    next = Barriers::first + Barriers::count),
   ...);
  return ok && next <= kNamedBarrierIds;
}

// A stage ring of kStages buffers, each guarded by an mbarrier: use number u
// (0, 1, 2, ...) of the ring lands in stage u mod kStages, and waits for the
// barrier's phase of parity (u / kStages) mod 2. Made from the use number where
// it is needed (no state carried across a loop: the kernels run at their
// register limits).
template <int kStages>
struct PipelineState {
  int index;
  uint32_t phase;
  __device__ __forceinline__ static PipelineState of(int64_t use) {
    return {int(use % kStages), uint32_t(use / kStages) & 1u};
  }
};

// A two-sided hand-over on an mbarrier initialised with the count of threads
// that take part: each arrives (release: its prior writes) and waits for the
// phase to complete (acquire: everyone's), like a named barrier reached at
// different instructions, which PTX leaves undefined for the aligned bar.sync
// and compute-sanitizer's racecheck does not always take as ordering. Use
// number u of the barrier waits for parity u & 1: no thread arrives for use
// u + 1 before phase u has completed, since it waited for it.
__device__ __forceinline__ void mbarrier_arrive_and_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(bar));
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "mbarrier.arrive.shared::cta.b64 _, [%0];\n"
      "HAND_OVER_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra.uni HAND_OVER_WAIT;\n"
      "}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}

// One arrival on an mbarrier (release: this thread's prior writes), for a
// hand-over one way: the other side waits for the phase (tma::wait).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
               : "memory");
}

// The registers a thread gets at launch with kThreads threads a CTA and one CTA
// an SM: the register file over the threads, rounded down to 8. setmaxnreg.inc
// takes registers only from those the CTA's own .dec released (it waits
// otherwise: a deadlock), so a split must balance against this.
template <int kThreads>
constexpr int launch_registers() {
  return (65536 / kThreads) & ~7;
}

// Sets this warpgroup's register count: up from the launch allocation (inc) or
// down (dec), every thread of the warpgroup together.
template <int kRegisters, int kLaunchRegisters>
__device__ __forceinline__ void set_max_registers() {
  if constexpr (kRegisters > kLaunchRegisters) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  } else {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
  }
}

// The lane index read again where it is used (volatile: not merged with an
// earlier read), so that ptxas recomputes lane-derived indices instead of
// keeping them live, or spilled, across a loop at its register limit.
__device__ __forceinline__ int lane_id_again() {
  int l;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(l));
  return l;
}

// The warp index through a shuffle: ptxas then knows it is warp-uniform, and
// branches on it do not serialize a wgmma pipeline (C7520).
__device__ __forceinline__ int warp_id_uniform() { return __shfl_sync(0xffffffffu, int(threadIdx.x) >> 5, 0); }

}  // namespace flashqla::cuda::ws
