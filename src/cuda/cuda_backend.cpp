#include "cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/trace.h"
#include "cuda/sm90/cu_seqlens_check_sm90.h"
#include "cuda/sm90/gdn_fwd_fused_sm90.h"
#include "cuda/sm90/gdn_fwd_chain_tickets_sm90.h"
#include "cuda/sm90/gdn_fwd_piece_scan_sm90.h"
#include "cuda/sm90/gdn_fwd_simple_sm90.h"
#include "cuda/backward_piece_model.h"
#include "cuda/backward_support.h"

namespace flashqla::cuda {
namespace {

void check_cuda(cudaError_t err, const char* entry, const char* what) {
  if (err != cudaSuccess) {
    fail(FLASHQLA_STATUS_CUDA_ERROR,
         str(entry, ": ", what, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err)));
  }
}

// The kernels are compiled for sm_90a only (WGMMA / TMA); anything else has
// no kernel image to run.
void require_sm90(const char* entry) {
  int device = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&device), entry, "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), entry,
             "cudaDeviceGetAttribute");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), entry,
             "cudaDeviceGetAttribute");
  if (major != 9 || minor != 0) {
    fail(FLASHQLA_STATUS_NOT_SUPPORTED,
         str(entry, ": device ", device, ": flashqla's CUDA kernels need an sm_90 GPU (H100/H200), "
                    "found compute capability ", major, ".", minor));
  }
}

// The documented debug switch: checks cu_seqlens on the device and
// synchronises the stream to read the verdict.
void debug_check_cu_seqlens(const flashqla_gdn_fwd_params_t& p, const Problem& pr,
                            const char* entry) {
  auto* result = static_cast<uint32_t*>(p.workspace);
  check_cuda(launch_check_cu_seqlens(p.cu_seqlens.data, p.cu_seqlens.dtype == FLASHQLA_DTYPE_INT64,
                                     pr.N, pr.T, result, p.stream),
             entry, "cu_seqlens debug check launch");
  uint32_t issues = 0;
  check_cuda(cudaMemcpyAsync(&issues, result, sizeof(issues), cudaMemcpyDeviceToHost, p.stream),
             entry, "cu_seqlens debug check copy");
  check_cuda(cudaStreamSynchronize(p.stream), entry, "cu_seqlens debug check sync");
  if (issues == kCuSeqlensOk) return;
  std::string what;
  if (issues & kCuSeqlensBadStart) what += " must start at 0;";
  if (issues & kCuSeqlensDecreasing) what += " must be non-decreasing;";
  if (issues & kCuSeqlensBadEnd) what += str(" must end at T = ", pr.T, ";");
  what.pop_back();
  fail(FLASHQLA_STATUS_INVALID_CU_SEQLENS,
       str(entry, ": cu_seqlens (checked on the device):", what));
}

// FLASHQLA_FORWARD_KERNEL=simple runs the simple kernel on every shape (to
// compare the two kernels on the same inputs).
bool simple_forward_forced() {
  static const bool forced = [] {
    const char* v = std::getenv("FLASHQLA_FORWARD_KERNEL");
    return v != nullptr && std::strcmp(v, "simple") == 0;
  }();
  return forced;
}

ForwardArgs forward_args(const Problem& pr, const flashqla_gdn_fwd_params_t& p) {
  ForwardArgs a{};
  a.T = pr.T;
  a.H = pr.H;
  a.HV = pr.HV;
  a.K = pr.K;
  a.V = pr.V;
  a.N = pr.N;
  a.group = pr.group;
  a.scale = static_cast<float>(pr.scale);
  a.q = p.q.data, a.q_sb = p.q.stride[0], a.q_st = p.q.stride[1], a.q_sh = p.q.stride[2];
  a.k = p.k.data, a.k_sb = p.k.stride[0], a.k_st = p.k.stride[1], a.k_sh = p.k.stride[2];
  a.v = p.v.data, a.v_sb = p.v.stride[0], a.v_st = p.v.stride[1], a.v_sh = p.v.stride[2];
  a.token_dtype = p.q.dtype;
  a.g = p.g.data, a.g_sb = p.g.stride[0], a.g_st = p.g.stride[1], a.g_dtype = p.g.dtype;
  a.beta = p.beta.data, a.beta_sb = p.beta.stride[0], a.beta_st = p.beta.stride[1];
  a.beta_dtype = p.beta.dtype;
  if (pr.has_initial_state) {
    const flashqla_tensor_t& h0 = p.initial_state;
    a.h0 = h0.data, a.h0_sn = h0.stride[0], a.h0_sh = h0.stride[1], a.h0_s2 = h0.stride[2];
    a.h0_s3 = h0.stride[3], a.h0_dtype = h0.dtype;
  }
  if (pr.varlen) {
    a.cu_seqlens = p.cu_seqlens.data;
    a.cu_seqlens_int64 = p.cu_seqlens.dtype == FLASHQLA_DTYPE_INT64;
  }
  if (pr.checkpoint_chunks > 0) {
    const flashqla_tensor_t& c = p.checkpoints;
    a.ckpt = c.data, a.ckpt_sn = c.stride[0], a.ckpt_sh = c.stride[1], a.ckpt_s2 = c.stride[2];
    a.ckpt_s3 = c.stride[3], a.ckpt_dtype = c.dtype, a.ckpt_chunks = pr.checkpoint_chunks;
  }
  if (pr.pooled) {
    a.state_indices = p.state_indices.data;
    a.state_indices_int64 = p.state_indices.dtype == FLASHQLA_DTYPE_INT64;
    a.pool_slots = pr.pool_slots;
  }
  a.o = p.o.data, a.o_sb = p.o.stride[0], a.o_st = p.o.stride[1], a.o_sh = p.o.stride[2], a.o_dtype = p.o.dtype;
  if (pr.output_final_state) {
    const flashqla_tensor_t& ht = p.final_state;
    a.ht = ht.data, a.ht_sn = ht.stride[0], a.ht_sh = ht.stride[1], a.ht_s2 = ht.stride[2];
    a.ht_s3 = ht.stride[3], a.ht_dtype = ht.dtype;
  }
  a.state_v_first = p.state_v_first != 0;
  a.use_qk_l2norm = p.use_qk_l2norm != 0;
  a.beta_activation = p.beta_activation;
  return a;
}

// --- intra-card sequence parallelism (fused kernel) ----------------------------
// With fewer (sequence, value head) chains than SMs, sequences may be cut into
// pieces (sequence_pieces.h): by default where the cost model says that pays,
// from the sequence lengths when the host knows them (no cu_seqlens, or a host
// copy given), as if equal otherwise. With at least as many chains as SMs the
// pieces are chained (one launch, no extra work). FLASHQLA_SEQUENCE_PARALLEL=1
// cuts whenever it can, =2 chains pieces whatever the chain count (a test of the
// hand-over), =0 never. FLASHQLA_PIECE_CHUNKS=n fixes the piece length (for
// tests and tuning).
int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoll(v, nullptr, 10) : fallback;
}

PlanSwitches plan_switches() {
  PlanSwitches s;
  s.force_simple = simple_forward_forced();
  s.sequence_parallel = static_cast<int>(env_int("FLASHQLA_SEQUENCE_PARALLEL", -1));
  s.piece_chunks = env_int("FLASHQLA_PIECE_CHUNKS", 0);
  return s;
}

int sm_count() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return sms;
}

// q, k and v share one dtype on the GPU (the kernels load them alike).
void require_shared_token_dtype(const flashqla_gdn_fwd_params_t& p, const char* entry) {
  if (p.k.dtype != p.q.dtype || p.v.dtype != p.q.dtype) {
    fail(FLASHQLA_STATUS_NOT_SUPPORTED,
         str(entry, ": q, k and v must share one dtype on the CUDA backend (got ", dtype_name(p.q.dtype), ", ",
             dtype_name(p.k.dtype), ", ", dtype_name(p.v.dtype), ")"));
  }
}

}  // namespace

ForwardPlan plan_forward(const Problem& pr, const flashqla_gdn_fwd_params_t& p, const char* entry) {
  require_sm90(entry);
  require_shared_token_dtype(p, entry);
  return make_forward_plan(pr, forward_args(pr, p), sm_count(), plan_switches());
}

namespace {

size_t max_shared_memory_per_block(const char* entry) {
  int device = 0, bytes = 0;
  check_cuda(cudaGetDevice(&device), entry, "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), entry,
             "cudaDeviceGetAttribute");
  return static_cast<size_t>(bytes);
}

void set_token_tensor(const flashqla_tensor_t& t, void*& data, int64_t& sb, int64_t& st, int64_t& sh,
                      flashqla_dtype_t& dtype) {
  data = t.data, sb = t.stride[0], st = t.stride[1], sh = t.stride[2], dtype = t.dtype;
}

void set_state_tensor(const flashqla_tensor_t& t, void*& data, int64_t& sn, int64_t& sh, int64_t& s2, int64_t& s3,
                      flashqla_dtype_t& dtype) {
  data = t.data, sn = t.stride[0], sh = t.stride[1], s2 = t.stride[2], s3 = t.stride[3], dtype = t.dtype;
}

BackwardArgs backward_args(const Problem& pr, const flashqla_gdn_bwd_params_t& p) {
  BackwardArgs a{};
  a.f = forward_args(pr, p.fwd);
  a.f.o = nullptr;
  a.f.ht = nullptr;
  a.B = pr.B;
  void* d_o = nullptr;
  set_token_tensor(p.d_o, d_o, a.do_sb, a.do_st, a.do_sh, a.do_dtype);
  a.d_o = d_o;
  if (p.d_final_state.data != nullptr) {
    void* dht = nullptr;
    set_state_tensor(p.d_final_state, dht, a.dht_sn, a.dht_sh, a.dht_s2, a.dht_s3, a.dht_dtype);
    a.dht = dht;
  }
  set_token_tensor(p.dq, a.dq, a.dq_sb, a.dq_st, a.dq_sh, a.dq_dtype);
  set_token_tensor(p.dk, a.dk, a.dk_sb, a.dk_st, a.dk_sh, a.dk_dtype);
  set_token_tensor(p.dv, a.dv, a.dv_sb, a.dv_st, a.dv_sh, a.dv_dtype);
  a.dg = p.dg.data, a.dg_sb = p.dg.stride[0], a.dg_st = p.dg.stride[1], a.dg_dtype = p.dg.dtype;
  a.dbeta = p.dbeta.data, a.dbeta_sb = p.dbeta.stride[0], a.dbeta_st = p.dbeta.stride[1];
  a.dbeta_dtype = p.dbeta.dtype;
  if (pr.has_initial_state) {
    set_state_tensor(p.d_initial_state, a.dh0, a.dh0_sn, a.dh0_sh, a.dh0_s2, a.dh0_s3, a.dh0_dtype);
  }
  return a;
}

// FLASHQLA_BACKWARD_KERNEL=simple runs the simple backward on every shape.
bool simple_backward_forced() {
  static const bool forced = [] {
    const char* v = std::getenv("FLASHQLA_BACKWARD_KERNEL");
    return v != nullptr && std::strcmp(v, "simple") == 0;
  }();
  return forced;
}

// The tensor-core backward's last step runs on the warpgroup kernel
// (gdn_bwd_tc_grads_wg_sm90.cu); FLASHQLA_BACKWARD_GRADS=warps runs the 16-warp
// mma.sync kernel it replaced (gdn_bwd_tc_grads_sm90.cu), kept to measure
// against and checked by the GPU suite (tests/CMakeLists.txt).
enum class GradsKernel { kWarpgroups, kWarps };
GradsKernel grads_kernel_selected() {
  static const GradsKernel selected = [] {
    const char* v = std::getenv("FLASHQLA_BACKWARD_GRADS");
    return v != nullptr && std::strcmp(v, "warps") == 0 ? GradsKernel::kWarps : GradsKernel::kWarpgroups;
  }();
  return selected;
}

}  // namespace

BackwardPlan plan_backward(const Problem& pr, const flashqla_gdn_bwd_params_t& p, const char* entry) {
  require_sm90(entry);
  require_shared_token_dtype(p.fwd, entry);
  BackwardPlan plan;
  plan.args = backward_args(pr, p);
  plan.reason = simple_backward_forced() ? std::string("FLASHQLA_BACKWARD_KERNEL=simple")
                                         : tensor_core_backward_refusal(plan.args);
  plan.tensor_core = plan.reason.empty();
  if (plan.tensor_core) {
    // FLASHQLA_BACKWARD_CHAIN_COLUMNS=16|32 forces the chains' width (read at every call).
    const int64_t forced_columns = env_int("FLASHQLA_BACKWARD_CHAIN_COLUMNS", 0);
    plan.chain_columns = chains_value_columns(pr.N, pr.HV, sm_count(), forced_columns);
    // Sequence pieces of the chains (two passes and a scan; the grads then after
    // them): where the model says they pay (backward_piece_model.h), from the
    // sequence lengths the host knows (as the forward's plan). The warp-grads
    // kernel is a reference path: never cut under it.
    // FLASHQLA_BACKWARD_PIECE_CHUNKS=n forces pieces of n chunks, =0 whole sequences.
    const int64_t forced_pieces = env_int("FLASHQLA_BACKWARD_PIECE_CHUNKS", -1);
    int64_t piece_chunks = forced_pieces > 0 ? forced_pieces : 0;
    if (forced_pieces < 0 && grads_kernel_selected() == GradsKernel::kWarpgroups &&
        backward_pieces_considered(pr.N, pr.HV, sm_count())) {
      const BackwardPiecePlan model = best_backward_pieces(
          planned_sequence_chunks(pr.T, pr.N, pr.varlen, pr.cu_seqlens_host.empty() ? nullptr : pr.cu_seqlens_host.data()),
          pr.HV, pr.H, sm_count());
      piece_chunks = model.piece_chunks;
      if (piece_chunks > 0 && forced_columns != 16 && forced_columns != 32) plan.chain_columns = model.columns;
    }
    if (piece_chunks > 0 && piece_chunks < (pr.T + kPieceChunkTokens - 1) / kPieceChunkTokens) {
      plan.piece_chunks = piece_chunks;
      plan.max_pieces = sequence_piece_count(pr.T, piece_chunks);  // no sequence is longer than T
    }
    plan.tc = tensor_core_backward_layout(pr.B, pr.T, pr.N, pr.HV, pr.varlen, kCuSeqlensCheckBytes,
                                          pr.N * plan.max_pieces);
    plan.bytes = plan.tc.bytes;
    // FLASHQLA_BACKWARD_GRADS_BESIDE=0|1 forces the grads after or beside the chains.
    plan.grads_beside = grads_kernel_selected() == GradsKernel::kWarpgroups && plan.piece_chunks == 0 &&
                        grads_beside_chains(pr.N, pr.HV, plan.chain_columns, sm_count(),
                                            env_int("FLASHQLA_BACKWARD_GRADS_BESIDE", -1));
  } else {
    plan.simple = simple_backward_layout(pr.B, pr.T, pr.N, pr.HV, pr.K, pr.V, pr.varlen, kCuSeqlensCheckBytes,
                                         max_shared_memory_per_block(entry));
    plan.bytes = plan.simple.bytes;
  }
  return plan;
}

void gdn_forward(const Problem& pr, const flashqla_gdn_fwd_params_t& p, const ForwardPlan& plan) {
  constexpr const char* entry = "flashqla_gdn_fwd";
  if (pr.debug_check_cu_seqlens) debug_check_cu_seqlens(p, pr, entry);
  ForwardArgs args = plan.args;
  if (plan.pieces.chunks > 0) {
    if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0) {
      fail(FLASHQLA_STATUS_INVALID_ARGUMENT,
           str(entry, ": workspace: must be 16-byte aligned (it holds the sequence pieces' states)"));
    }
    args.piece_chunks = plan.pieces.chunks;
    args.piece_slots = plan.pieces.slots;
    unsigned char* const ws = static_cast<unsigned char*>(p.workspace);
    args.piece_states = reinterpret_cast<float*>(ws + plan.layout.states);
    if (plan.pieces.chained) {
      // The ticket table and zeroed counters, then one launch of the pieces.
      args.chain_tickets = reinterpret_cast<int2*>(ws + plan.layout.tickets);
      args.chain_counters = reinterpret_cast<unsigned*>(ws + plan.layout.counters);
      args.piece_pass = kChainedPieces;
      check_cuda(launch_gdn_fwd_chain_tickets(args, p.stream), entry, "chained pieces' ticket table launch");
      check_cuda(launch_gdn_fwd_fused(args, p.stream), entry, "fused forward kernel launch (chained pieces)");
      return;
    }
    args.programmatic_output_pass = env_int("FLASHQLA_PROGRAMMATIC_LAUNCH", 1) != 0;
    args.piece_pass = kPiecePartials;
    check_cuda(launch_gdn_fwd_fused(args, p.stream), entry, "fused forward kernel launch (piece partials)");
    check_cuda(launch_gdn_fwd_piece_scan(args, p.stream), entry, "piece scan launch");
    args.piece_pass = kPieceOutputs;
    check_cuda(launch_gdn_fwd_fused(args, p.stream), entry, "fused forward kernel launch (piece outputs)");
  } else if (plan.fused) {
    check_cuda(launch_gdn_fwd_fused(args, p.stream), entry, "fused forward kernel launch");
  } else {
    check_cuda(launch_gdn_fwd_simple(args, p.stream), entry, "simple forward kernel launch");
  }
}

void gdn_backward(const Problem& pr, const flashqla_gdn_bwd_params_t& p, const BackwardPlan& plan) {
  constexpr const char* entry = "flashqla_gdn_bwd";
  if (pr.debug_check_cu_seqlens) debug_check_cu_seqlens(p.fwd, pr, entry);
  if (reinterpret_cast<uintptr_t>(p.fwd.workspace) % 256 != 0) {
    fail(FLASHQLA_STATUS_INVALID_ARGUMENT,
         str(entry, ": workspace: must be 256-byte aligned (it holds the chunk states and per-chunk products)"));
  }
  unsigned char* const ws = static_cast<unsigned char*>(p.fwd.workspace);
  BackwardArgs a = plan.args;
  if (plan.tensor_core) {
    const TensorCoreBackwardLayout& l = plan.tc;
    a.chunk_slots = l.chunk_slots;
    a.w = reinterpret_cast<uint16_t*>(ws + l.w);
    a.u0 = reinterpret_cast<uint16_t*>(ws + l.u0);
    a.z = reinterpret_cast<uint16_t*>(ws + l.z);
    a.minv = reinterpret_cast<uint16_t*>(ws + l.minv);
    a.rows = reinterpret_cast<float4*>(ws + l.rows);
    a.states = reinterpret_cast<uint16_t*>(ws + l.states);
    a.dstates = reinterpret_cast<uint16_t*>(ws + l.dstates);
    FLASHQLA_PLAN("%s: tensor-core backward: %lld chunk slots, chains of %d value columns, pieces of %lld chunks "
                  "(0: none), grads %s them, workspace %zu bytes",
                  entry, (long long)l.chunk_slots, plan.chain_columns, (long long)plan.piece_chunks,
                  plan.grads_beside ? "beside" : "after", l.bytes);
    if (plan.grads_beside) {
      a.chain_progress = reinterpret_cast<unsigned*>(ws + l.progress);
      a.chain_tiles = 128 / plan.chain_columns;
      check_cuda(cudaMemsetAsync(a.chain_progress, 0, l.progress_bytes, p.fwd.stream), entry,
                 "chain progress counts reset");
    }
    check_cuda(launch_gdn_bwd_tc_prep(a, p.fwd.stream), entry, "tensor-core backward prep launch");
    if (plan.piece_chunks == 0) {
      check_cuda(launch_gdn_bwd_tc_chains(a, plan.chain_columns, p.fwd.stream), entry,
                 "tensor-core backward chains launch");
    } else {  // sequence pieces: the first pass, the scan, the rerun
      a.piece_chunks = plan.piece_chunks;
      a.max_pieces = plan.max_pieces;
      a.piece_states = reinterpret_cast<float*>(ws + l.pieces);
      a.chain_pass = 1;
      check_cuda(launch_gdn_bwd_tc_chains(a, plan.chain_columns, p.fwd.stream), entry,
                 "tensor-core backward chains launch (pieces, first pass)");
      check_cuda(launch_gdn_bwd_tc_piece_scan(a, p.fwd.stream), entry, "tensor-core backward piece scan launch");
      a.chain_pass = 2;
      check_cuda(launch_gdn_bwd_tc_chains(a, plan.chain_columns, p.fwd.stream), entry,
                 "tensor-core backward chains launch (pieces, rerun)");
    }
    const GradsKernel grads = grads_kernel_selected();
    check_cuda(grads == GradsKernel::kWarpgroups
                   ? launch_gdn_bwd_tc_grads_warpgroups(a, p.fwd.stream)
                   : launch_gdn_bwd_tc_grads(a, p.fwd.stream),
               entry, "tensor-core backward grads launch");
    return;
  }
  const SimpleBackwardLayout& l = plan.simple;
  a.chunk_states = reinterpret_cast<float*>(ws + l.states);
  a.chunk_slots = l.chunk_slots;
  a.partials = reinterpret_cast<float*>(ws + l.partials);
  a.v_tiles = l.v_tiles;
  FLASHQLA_PLAN("%s: simple backward (%s): V tile %d (%lld tiles), %lld chunk-state slots, workspace %zu bytes",
                entry, plan.reason.c_str(), l.v_tile, (long long)l.v_tiles, (long long)l.chunk_slots, l.bytes);
  check_cuda(launch_gdn_bwd_simple(a, l.v_tile, p.fwd.stream), entry, "simple backward launch");
}

}  // namespace flashqla::cuda
