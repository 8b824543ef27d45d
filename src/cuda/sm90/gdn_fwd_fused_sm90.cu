// The fused forward's kernel shell: owns shared memory (SharedStorage), the
// pipelines' barriers and the register split, resolves the CTA's work item
// (work_scheduler.cuh) and hands the warpgroups to their parts:
//   gdn_fwd_fused/chunk_producer.cuh   loads, gates, A, P and T of each chunk
//   gdn_fwd_fused/state_chain.cuh      the serial state update and O
//   gdn_fwd_fused/output_epilogue.cuh  O and the end state out
// gdn_fwd_fused/kernel_layout.cuh holds their shared shape; docs/design.md
// describes the algorithm part by part.
#include "cuda/sm90/gdn_fwd_fused_sm90.h"

#include "core/trace.h"
#include "cuda/fused_forward_support.h"
#include "cuda/sm90/device_common.cuh"
#include "cuda/sm90/gdn_fwd_fused/chunk_producer.cuh"
#include "cuda/sm90/gdn_fwd_fused/kernel_layout.cuh"
#include "cuda/sm90/gdn_fwd_fused/output_epilogue.cuh"
#include "cuda/sm90/gdn_fwd_fused/state_chain.cuh"
#include "cuda/sm90/tma_load.cuh"
#include "cuda/sm90/token_tensor_map.h"
#include "cuda/sm90/work_scheduler.cuh"

namespace flashqla::cuda {
namespace {

using namespace fused_fwd;

// kCheckpoints: the instance that also writes state checkpoints (ForwardArgs::ckpt);
// the other's code has none of it.
template <typename Element, bool kCheckpoints>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_fwd_fused_kernel(const ForwardArgs a, const __grid_constant__ TokenMaps maps) {
  extern __shared__ __align__(1024) unsigned char smem[];
  SharedStorage<Element>& s = *reinterpret_cast<SharedStorage<Element>*>(smem);
  const int tid = threadIdx.x, warp = ws::warp_id_uniform(), lane = tid & 31;

  const WorkItem item = resolve_work_item(a, blockIdx.x, s.inverse.ranking);
  if (!item.valid) return;
  // Token indices in 32 bits (fused_forward_supports: T < 2^31, as TMA's
  // coordinates are), which also keeps them in one register each.
  const int eos = int(item.seq.eos);
  const int bos = int(item.seq.bos + item.chunk_begin * kChunk);  // the item's first token
  const int64_t n_chunks = __shfl_sync(0xffffffffu, item.chunk_end - item.chunk_begin, 0);
  if (tid == 0) {
    for (int i = 0; i < kQKStages; ++i) tma::barrier_init(s.qk_loaded + i, 1);
    for (int i = 0; i < kHandOverStages; ++i) {
      tma::barrier_init(s.v_loaded + i, 1);
      tma::barrier_init(s.chunk_ready + i, kProducerThreads);
    }
    tma::fence_barrier_init();
    // A chained piece's counters, parked for the state warpgroups (kept out of
    // registers across the producer's part).
    s.parked.signal = item.link.signal ? item.link.counter : nullptr;
    s.parked.wait = item.link.wait_for > 0 ? item.link.counter : nullptr;
    s.parked.wait_for = item.link.wait_for;
  }
  __syncthreads();

  if (warp >= kStateThreads / 32) {
    ws::set_max_registers<kProducerRegisters, kLaunchRegisters>();
    run_chunk_producer(s, a, maps, item, warp - kStateThreads / 32, lane, bos, eos, n_chunks);
    return;
  }

  ws::set_max_registers<kStateRegisters, kLaunchRegisters>();
  const int wr = warp & 3;
  const int v0 = 64 * (warp >> 2);  // the warpgroup's first value
  if (tid == 0) {
    s.parked.final_state = item.final_state;
    if constexpr (kCheckpoints) {
      s.parked.checkpoints = item.true_start ? user_checkpoints(a, item.n, item.hv) : StateTarget{};
      s.parked.checkpoint_rows = a.ckpt_sn;
      s.parked.checkpoint_done = item.chunk_begin;
      s.parked.checkpoint_every = int(a.ckpt_chunks);
    }
    s.parked.output_mode = item.write_o ? (maps.o_tensor ? kOutputTensor : kOutputRows) : kOutputNone;
    s.parked.o_token = bos;
    s.parked.o_head = int(item.hv);
    s.parked.o_row = int(item.seq.row);
    s.parked.last_rows = int(min64(kChunk, int64_t(eos - bos) - (n_chunks - 1) * kChunk));
    s.parked.o_rows = static_cast<Element*>(a.o) + item.seq.row * a.o_sb + item.hv * a.o_sh +
                      int64_t(bos) * a.o_st;  // the item's first token
  }
  float state[64];  // Sᵀ (state_chain.cuh)
  StateChain<Element> chain(s, state, lane, wr, v0);
  // The output pass's start states come from the piece scan, which may still be
  // running (programmatic dependent launch); no-op in any other launch. Only the
  // state warpgroups read what an earlier grid of the forward wrote.
  wait_for_prerequisite_grids();
  // A chained piece's start state is its predecessor's end state.
  if (unsigned* const wait = s.parked.wait; wait != nullptr) wait_until_at_least(wait, s.parked.wait_for);
  chain.load_start_state(item.init);
  const OutputEpilogue<Element> output{s, a, maps, warp, wr, v0};
  StateBarrier::sync();  // the parked item written
  chain.template run<kCheckpoints>(int(n_chunks), output);
  store_end_state(s, state, v0, wr, lane >> 2, lane & 3);
}

template <typename Element, bool kCheckpoints>
cudaError_t launch_typed(const ForwardArgs& args, cudaStream_t stream) {
  cudaError_t err =
      cudaFuncSetAttribute(gdn_fwd_fused_kernel<Element, kCheckpoints>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           kSharedBytes<Element>);
  if (err != cudaSuccess) return err;
  const int64_t blocks = work_item_count(args);
  if (blocks == 0) return cudaSuccess;
  TokenMaps maps;
  const int64_t rows = token_rows(args);
  // q and k a 64-feature block a load (each block lands between the other's: the stage's [K; Q] tile).
  err = encode_token_tile_map(&maps.q, args.q, args.token_dtype, rows, args.T, args.H, args.q_sb, args.q_st, args.q_sh,
                              /*feature_blocks=*/1);
  if (err == cudaSuccess)
    err = encode_token_tile_map(&maps.k, args.k, args.token_dtype, rows, args.T, args.H, args.k_sb, args.k_st, args.k_sh,
                                /*feature_blocks=*/1);
  if (err == cudaSuccess)
    err = encode_token_tile_map(&maps.v, args.v, args.token_dtype, rows, args.T, args.HV, args.v_sb, args.v_st, args.v_sh);
  if (err != cudaSuccess) return err;
  // o by tensor stores where its layout allows (a map the driver refuses: by rows).
  maps.o_tensor = fused_output_tensor_storable(args) &&
                  encode_output_tile_map(&maps.o, args.o, args.o_dtype, rows, args.T, args.HV, args.o_sb, args.o_st,
                                         args.o_sh) == cudaSuccess;
  FLASHQLA_PLAN("gdn_fwd_fused_kernel: pass=%d grid=%lld block=%d smem=%d bytes (chunk %d, K=V=%d, piece %lld chunks)",
                args.piece_pass, (long long)blocks, kThreads, kSharedBytes<Element>, kChunk, kDim, (long long)args.piece_chunks);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSharedBytes<Element>;
  config.stream = stream;
  cudaLaunchAttribute programmatic{};
  programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  programmatic.val.programmaticStreamSerializationAllowed = 1;
  if (args.piece_pass == kPieceOutputs && args.programmatic_output_pass) {
    config.attrs = &programmatic;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, gdn_fwd_fused_kernel<Element, kCheckpoints>, args, maps);
}

}  // namespace

cudaError_t launch_gdn_fwd_fused(const ForwardArgs& args, cudaStream_t stream) {
  if (args.ckpt != nullptr) {
    return args.token_dtype == FLASHQLA_DTYPE_BFLOAT16 ? launch_typed<__nv_bfloat16, true>(args, stream)
                                                      : launch_typed<__half, true>(args, stream);
  }
  return args.token_dtype == FLASHQLA_DTYPE_BFLOAT16 ? launch_typed<__nv_bfloat16, false>(args, stream)
                                                    : launch_typed<__half, false>(args, stream);
}

}  // namespace flashqla::cuda
