// Does compute-sanitizer's racecheck take a barrier reached at two different
// instructions as ordering? Warp 0 stores shared words, then a barrier; warp 1
// a barrier, then loads them (each value checked). Four forms of the barrier,
// one per kernel (the argument picks it): __syncthreads; barrier.sync 0 and
// barrier.sync 1, 64 each reached at two instructions (the warpgroup kernels'
// CTA barriers and hand-overs); bar.arrive by the storing warp, barrier.sync by
// the loading one.
// Then the writes the kernels' open reports involve (docs/reliability.md), each
// with barrier.sync 0 reached at two instructions: cp.async copies of 16 bytes,
// with their source read or ignored (rows past a partial chunk, zero-filled),
// read after the barrier, or read before it and written after it; and zeros
// stored before bar.arrive, read by ldmatrix after barrier.sync.
// Then hand-overs in sequence, as the kernels chain them: a load after a
// bar.arrive / barrier.sync hand-over, then barrier.sync 0, then a store to the
// loaded words by the arriving warp (arrive_then_cta); a load, bar.arrive, and
// the other warp's barrier.sync and store (war_across_arrive); and a two-stage
// ring over eight rounds, each stage handed over one way each time (ready:
// producer arrives, consumer syncs; free: consumer arrives, producer syncs), as
// the fused forward runs its stages (ring).
// Then the same cp.async hand-over across many CTAs (cta_turns GRID [fenced]):
// 200 KB of dynamic shared memory a CTA, so one CTA an SM and the CTAs of a
// grid larger than the SM count in turn on the same shared memory, the words
// at 64 KB and above as in the kernels; fenced: a CTA barrier after the last
// loads. Every CTA is race-free on its own, so a report here is between CTAs.
//   compute-sanitizer --tool racecheck racecheck_barriers cta_diff_pc
#include <cstdio>
#include <cstdlib>
#include <cstring>
__global__ void k_same_pc(int* out) {  // __syncthreads, one instruction
  __shared__ int buf[32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) buf[l] = l + 1;
  __syncthreads();
  if (w == 1) out[l] = buf[l];
}
// The barrier forms, as the storing warp (before) and the loading warp (after)
// reach them, each at its own instruction.
enum class Form { kCta, kNamed, kArrive };
template <Form kForm>
__device__ __forceinline__ void storer_barrier() {
  if constexpr (kForm == Form::kCta) asm volatile("barrier.sync 0;" ::: "memory");
  if constexpr (kForm == Form::kNamed) asm volatile("barrier.sync 1, 64;" ::: "memory");
  if constexpr (kForm == Form::kArrive) asm volatile("bar.arrive 1, 64;" ::: "memory");
}
template <Form kForm>
__device__ __forceinline__ void loader_barrier() {
  if constexpr (kForm == Form::kCta) asm volatile("barrier.sync 0;" ::: "memory");
  if constexpr (kForm != Form::kCta) asm volatile("barrier.sync 1, 64;" ::: "memory");
}
template <Form kForm>
__global__ void k_two_pcs(int* out) {
  __shared__ int buf[32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) {
    buf[l] = l + 1;
    storer_barrier<kForm>();
    out[64 + l] = 7;
  } else {
    out[96 + l] = 9;
    loader_barrier<kForm>();
    out[l] = buf[l];
  }
}
__device__ __forceinline__ void copy16(void* dst, const void* src, bool read_src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(read_src ? 16 : 0) : "memory");
}
__device__ __forceinline__ void copies_landed() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Warp 0 copies 16 bytes a lane (from src, or zeros), waits, barrier; warp 1
// barrier, loads.
template <bool kReadSrc>
__global__ void k_cp_async(int* out, const int4* src) {
  __shared__ int4 buf[32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) {
    copy16(&buf[l], &src[l], kReadSrc);
    copies_landed();
    storer_barrier<Form::kCta>();
    out[64 + l] = 7;
  } else {
    out[96 + l] = 9;
    loader_barrier<Form::kCta>();
    out[l] = buf[l].x + (kReadSrc ? 0 : l + 1);
  }
}
// Warp 1 loads, barrier; warp 0 barrier, then zero-fills the same words by cp.async.
__global__ void k_cp_async_after_read(int* out, const int4* src) {
  __shared__ int4 buf[32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) buf[l] = make_int4(l + 1, 0, 0, 0);
  __syncthreads();
  if (w == 1) {
    out[l] = buf[l].x;
    loader_barrier<Form::kCta>();
    out[96 + l] = 9;
  } else {
    out[64 + l] = 7;
    storer_barrier<Form::kCta>();
    copy16(&buf[l], &src[l], false);
    copies_landed();
  }
}
// Warp 0 stores zeros, bar.arrive; warp 1 barrier.sync, ldmatrix of those rows.
__global__ void k_ldmatrix_after_arrive(int* out) {
  __shared__ __align__(16) unsigned short tile[4 * 64];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) {
    reinterpret_cast<uint4*>(tile)[l] = make_uint4(0, 0, 0, 0);
    storer_barrier<Form::kArrive>();
    out[64 + l] = 7;
  } else {
    out[96 + l] = 9;
    loader_barrier<Form::kArrive>();
    unsigned r0, r1, r2, r3;
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(tile + 8 * l));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
    out[l] = static_cast<int>(r0 | r1 | r2 | r3) + l + 1;
  }
}
__global__ void k_arrive_then_cta(int* out) {
  __shared__ int buf[32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) {
    buf[l] = l + 1;
    asm volatile("bar.arrive 1, 64;" ::: "memory");
    asm volatile("barrier.sync 0;" ::: "memory");
    buf[l] = 0;
  } else {
    asm volatile("barrier.sync 1, 64;" ::: "memory");
    out[l] = buf[l];
    asm volatile("barrier.sync 0;" ::: "memory");
  }
}
__global__ void k_war_across_arrive(int* out) {
  __shared__ int buf[32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) buf[l] = l + 1;
  __syncthreads();
  if (w == 1) {
    out[l] = buf[l];
    asm volatile("bar.arrive 2, 64;" ::: "memory");
  } else {
    asm volatile("barrier.sync 2, 64;" ::: "memory");
    buf[l] = 0;
  }
}
// Ready barriers 1 and 2, free barriers 3 and 4 (stage 0 and 1).
__global__ void k_ring(int* out) {
  __shared__ int buf[2][32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  int sum = 0;
  for (int round = 0; round < 8; ++round) {
    const int st = round % 2;
    if (w == 0) {
      if (round >= 2) {
        if (st == 0) asm volatile("barrier.sync 3, 64;" ::: "memory");
        if (st == 1) asm volatile("barrier.sync 4, 64;" ::: "memory");
      }
      buf[st][l] = round + l;
      if (st == 0) asm volatile("bar.arrive 1, 64;" ::: "memory");
      if (st == 1) asm volatile("bar.arrive 2, 64;" ::: "memory");
    } else {
      if (st == 0) asm volatile("barrier.sync 1, 64;" ::: "memory");
      if (st == 1) asm volatile("barrier.sync 2, 64;" ::: "memory");
      sum += buf[st][l] - round;
      if (round < 6) {
        if (st == 0) asm volatile("bar.arrive 3, 64;" ::: "memory");
        if (st == 1) asm volatile("bar.arrive 4, 64;" ::: "memory");
      }
    }
  }
  if (w == 1) out[l] = sum / 8 + 1;
}
// Warp 0 copies 16 bytes a lane at 64 KB into the dynamic shared memory, waits,
// barrier; warp 1 barrier, loads them (its last access); optionally a barrier.
constexpr int kTurnsSmem = 200 * 1024, kTurnsOffset = 64 * 1024;
template <bool kFenced>
__global__ void k_cta_turns(int* out, const int4* src) {
  extern __shared__ __align__(16) unsigned char dyn[];
  int4* const buf = reinterpret_cast<int4*>(dyn + kTurnsOffset);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) {
    copy16(&buf[l], &src[l], true);
    copies_landed();
    storer_barrier<Form::kCta>();
  } else {
    loader_barrier<Form::kCta>();
    const int x = buf[l].x;
    if (blockIdx.x == 0) out[l] = x;
  }
  if constexpr (kFenced) __syncthreads();
}
int main(int argc, char** argv) {
  int* out = nullptr;
  cudaMalloc(&out, 128 * sizeof(int));
  const char* which = argc > 1 ? argv[1] : "same_pc";
  if (!strcmp(which, "same_pc")) k_same_pc<<<1, 64>>>(out);
  if (!strcmp(which, "cta_diff_pc")) k_two_pcs<Form::kCta><<<1, 64>>>(out);
  if (!strcmp(which, "named_diff_pc")) k_two_pcs<Form::kNamed><<<1, 64>>>(out);
  if (!strcmp(which, "arrive_sync")) k_two_pcs<Form::kArrive><<<1, 64>>>(out);
  int4* src = nullptr;
  cudaMalloc(&src, 32 * sizeof(int4));
  int4 h_src[32];
  for (int i = 0; i < 32; ++i) h_src[i] = make_int4(i + 1, 0, 0, 0);
  cudaMemcpy(src, h_src, sizeof(h_src), cudaMemcpyHostToDevice);
  if (!strcmp(which, "cp_async_copy")) k_cp_async<true><<<1, 64>>>(out, src);
  if (!strcmp(which, "cp_async_zero_fill")) k_cp_async<false><<<1, 64>>>(out, src);
  if (!strcmp(which, "cp_async_after_read")) k_cp_async_after_read<<<1, 64>>>(out, src);
  if (!strcmp(which, "ldmatrix_after_arrive")) k_ldmatrix_after_arrive<<<1, 64>>>(out);
  if (!strcmp(which, "arrive_then_cta")) k_arrive_then_cta<<<1, 64>>>(out);
  if (!strcmp(which, "war_across_arrive")) k_war_across_arrive<<<1, 64>>>(out);
  if (!strcmp(which, "ring")) k_ring<<<1, 64>>>(out);
  if (!strcmp(which, "cta_turns")) {
    const int grid = argc > 2 ? atoi(argv[2]) : 2;
    const bool fenced = argc > 3 && !strcmp(argv[3], "fenced");
    auto* const kernel = fenced ? k_cta_turns<true> : k_cta_turns<false>;
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTurnsSmem);
    kernel<<<grid, 64, kTurnsSmem>>>(out, src);
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) printf("cta_turns: %s\n", cudaGetErrorString(err));
  }
  int h[32];
  cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int i = 0; i < 32; ++i) bad += h[i] != i + 1;
  printf("%s: %s\n", which, bad ? "WRONG" : "values right");
  return 0;
}
