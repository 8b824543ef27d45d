#include "cuda/sm90/gdn_fwd_chain_tickets_sm90.h"

#include "core/trace.h"
#include "cuda/sm90/work_scheduler.cuh"

namespace flashqla::cuda {
namespace {

constexpr int kThreads = 512;

// One CTA. Round j holds piece j of every sequence with more than j pieces
// (value heads fastest); without cu_seqlens every sequence has the same pieces,
// counted once with all N sequences' heads per round.
__global__ void __launch_bounds__(kThreads) gdn_fwd_chain_tickets_kernel(const ForwardArgs a, int64_t tickets) {
  __shared__ int pieces[kMaxRankedSequences];
  __shared__ int64_t round_start[kMaxChainRounds + 1];
  __shared__ int rounds;
  const int tid = threadIdx.x;
  for (int64_t i = tid; i < 1 + a.N * a.HV; i += kThreads) a.chain_counters[i] = 0u;
  const bool varlen = a.cu_seqlens != nullptr;
  const int n_seq = varlen ? int(a.N) : 1;
  const int64_t heads = varlen ? a.HV : a.N * a.HV;  // tickets of one sequence slot in a round
  for (int i = tid; i < n_seq; i += kThreads)
    pieces[i] = int(piece_count(a, sequence_range(a.cu_seqlens, a.cu_seqlens_int64, a.T, i)));
  if (tid == 0) rounds = 0;
  __syncthreads();
  for (int i = tid; i < n_seq; i += kThreads) atomicMax(&rounds, min(pieces[i], int(kMaxChainRounds)));
  __syncthreads();
  for (int j = tid; j < rounds; j += kThreads) {
    int count = 0;
    for (int i = 0; i < n_seq; ++i) count += pieces[i] > j;
    round_start[j + 1] = count * heads;
  }
  __syncthreads();
  if (tid == 0) {
    round_start[0] = 0;
    for (int j = 0; j < rounds; ++j) round_start[j + 1] += round_start[j];
  }
  __syncthreads();
  for (int64_t t = tid; t < tickets; t += kThreads) {
    int j = 0;
    while (j < rounds && t >= round_start[j + 1]) ++j;
    a.chain_tickets[t] = j < rounds ? make_int2(int(t - round_start[j]), j) : make_int2(0, -1);
  }
}

}  // namespace

cudaError_t launch_gdn_fwd_chain_tickets(const ForwardArgs& args, cudaStream_t stream) {
  const int64_t tickets = work_item_count(args);
  if (tickets == 0) return cudaSuccess;
  FLASHQLA_PLAN("gdn_fwd_chain_tickets_kernel: %lld tickets, block=%d", (long long)tickets, kThreads);
  gdn_fwd_chain_tickets_kernel<<<1, kThreads, 0, stream>>>(args, tickets);
  return cudaGetLastError();
}

}  // namespace flashqla::cuda
