// Does compute-sanitizer's racecheck take a barrier reached at two different
// instructions as ordering? Warp 0 stores shared words, then a barrier; warp 1
// a barrier, then loads them. Four forms of the barrier, one per kernel (the
// argument picks it): __syncthreads; barrier.sync 0 and barrier.sync 1, 64 each
// reached at two instructions (the warpgroup kernels' CTA barriers and
// hand-overs); bar.arrive by the storing warp, barrier.sync by the loading one.
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
__global__ void k_cta_diff_pc(int* out) {  // barrier.sync 0 at two instructions
  __shared__ int buf[32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) {
    buf[l] = l + 1;
    asm volatile("barrier.sync 0;" ::: "memory");
    out[64 + l] = 7;
  } else {
    out[96 + l] = 9;
    asm volatile("barrier.sync 0;" ::: "memory");
    out[l] = buf[l];
  }
}
__global__ void k_named_diff_pc(int* out) {  // barrier.sync 1, 64 at two instructions
  __shared__ int buf[32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) {
    buf[l] = l + 1;
    asm volatile("barrier.sync 1, 64;" ::: "memory");
    out[64 + l] = 7;
  } else {
    out[96 + l] = 9;
    asm volatile("barrier.sync 1, 64;" ::: "memory");
    out[l] = buf[l];
  }
}
__global__ void k_arrive_sync(int* out) {  // bar.arrive (writer) / barrier.sync (reader)
  __shared__ int buf[32];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (w == 0) {
    buf[l] = l + 1;
    asm volatile("bar.arrive 1, 64;" ::: "memory");
    out[64 + l] = 7;
  } else {
    out[96 + l] = 9;
    asm volatile("barrier.sync 1, 64;" ::: "memory");
    out[l] = buf[l];
  }
}
int main(int argc, char** argv) {
  int* out = nullptr;
  cudaMalloc(&out, 128 * sizeof(int));
  const char* which = argc > 1 ? argv[1] : "same_pc";
  if (!strcmp(which, "same_pc")) k_same_pc<<<1, 64>>>(out);
  if (!strcmp(which, "cta_diff_pc")) k_cta_diff_pc<<<1, 64>>>(out);
  if (!strcmp(which, "named_diff_pc")) k_named_diff_pc<<<1, 64>>>(out);
  if (!strcmp(which, "arrive_sync")) k_arrive_sync<<<1, 64>>>(out);
  int h[32];
  cudaMemcpy(h, out, sizeof(h), cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int i = 0; i < 32; ++i) bad += h[i] != i + 1;
  printf("%s: %s\n", which, bad ? "WRONG" : "values right");
  return 0;
}
