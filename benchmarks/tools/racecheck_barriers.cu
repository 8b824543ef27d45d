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
//   compute-sanitizer --tool racecheck racecheck_barriers cta_diff_pc
#include <cstdio>
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
  int h[32];
  cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int i = 0; i < 32; ++i) bad += h[i] != i + 1;
  printf("%s: %s\n", which, bad ? "WRONG" : "values right");
  return 0;
}
