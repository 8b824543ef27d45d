// The fused forward's shape: tile sizes, warpgroup roles and register split,
// named barriers, pipelines and the typed shared memory every part works in.
//
// Three warpgroups. Warpgroups 0 and 1 (the state chain, state_chain.cuh) run
// the state of chunk c, each for half the values (Sᵀ split by value rows: two
// independent chains); warpgroup 2 (the chunk producer, chunk_producer.cuh)
// loads chunk c + 1 and forms its gates, A, P = Q Kᵀ ⊙ Γ and Tβ meanwhile.
// Registers move to the state warpgroups.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>

#include "cuda/sequence_piece_layout.h"
#include "cuda/sm90/warp_mma.cuh"
#include "cuda/sm90/warp_specialization.cuh"
#include "cuda/sm90/work_scheduler.cuh"

namespace flashqla::cuda::fused_fwd {

constexpr int kChunk = 64;  // tokens per chunk
constexpr int kDim = 128;   // K = V
static_assert(kChunk == kPieceChunkTokens, "work items count chunks of the kernel's size");

constexpr int kStateThreads = 256;
constexpr int kProducerThreads = 128;
constexpr int kThreads = kStateThreads + kProducerThreads;
constexpr int kStateRegisters = 176, kProducerRegisters = 152;
constexpr int kLaunchRegisters = ws::launch_registers<kThreads>();
static_assert(kStateThreads * (kStateRegisters - kLaunchRegisters) <=
                  kProducerThreads * (kLaunchRegisters - kProducerRegisters),
              "the state warpgroups' registers come from the producer's");

// Stages. q and k (and the gate vectors γ, e^γ, e^{γ_C − γ}) have three: the
// producer loads chunk c + 1's while it works on c and the state warpgroups on
// c − 1. v, P, Tβ, β and the output tile have two (the hand-over stages: the
// chunk the producer hands over and the one the state warpgroups run).
constexpr int kQKStages = 3;
constexpr int kHandOverStages = 2;
using QKPipeline = ws::PipelineState<kQKStages>;
using HandOverPipeline = ws::PipelineState<kHandOverStages>;

// Named barriers (0 is __syncthreads).
// - StateBarrier: inside the state warpgroups (once an item);
// - ProducerBarrier: inside the producer warpgroup;
// - StageFree (a stage each): state -> producer, the stage may be refilled;
//   (its reverse, producer -> state, the chunk's operands are in place, is an
//   mbarrier a stage: SharedStorage::chunk_ready);
// - OutputWritten (a state warpgroup each): its output tile is written;
// - ProducerPair (a pair each): the producer's warps (0, 1) and (2, 3), each pair
//   owning one 32x32 diagonal block of T.
using StateBarrier = ws::NamedBarrier<1, 1, kStateThreads>;
using ProducerBarrier = ws::NamedBarrier<2, 1, kProducerThreads>;
using StageFree = ws::NamedBarrier<5, kHandOverStages, kThreads>;
using OutputWritten = ws::NamedBarrier<7, 2, 128>;
using ProducerPair = ws::NamedBarrier<9, 2, 64>;
static_assert(ws::named_barriers_disjoint<StateBarrier, ProducerBarrier, StageFree, OutputWritten, ProducerPair>(),
              "named barrier ids overlap");

constexpr int kLdF = kChunk + 4;  // row stride of the fp32 [64][64] tile of T
constexpr int kLdO = kDim + 8;    // row stride of the output tile by rows (conflict-free transposed writes)

// How the state warpgroups write o: not at all (a piece pass that only needs
// the end state); by one TMA tensor store a warpgroup a chunk from its output
// tile ([64 tokens][64 values], 128-byte swizzled: each of the box's rows is
// one whole 128-byte line of o), where o's base and strides allow it
// (fused_output_tensor_storable); else row by row from a padded output tile
// with 4-byte stores while the next chunk's last wgmmas run (row stores cost
// 8-10% of a chunk: docs/perf.md). A partial last chunk goes out by rows either way.
enum OutputMode : int { kOutputNone = 0, kOutputRows = 1, kOutputTensor = 2 };

// The tensor maps of q, k and v (tma_load.cuh), and of o where it is written by
// tensor stores (o_tensor), a kernel parameter.
struct TokenMaps {
  CUtensorMap q, k, v, o;
  int o_tensor;
};

// What the state warpgroups keep of their work item in shared memory for the
// chunk loop (fewer registers at its peak). Volatile: read back in the loop, a
// plain load of a value the loop does not write would be hoisted into a register.
template <typename Element>
struct ParkedItem {
  StateTarget final_state;
  // State checkpoints (the kernel's checkpoint instance only): the target at
  // the sequence's first row, rows `checkpoint_rows` apart; one every
  // `checkpoint_every` chunks of the sequence, whose first `checkpoint_done`
  // chunks precede the item's.
  StateTarget checkpoints;
  volatile int64_t checkpoint_rows, checkpoint_done;
  volatile int checkpoint_every;
  volatile int output_mode;  // OutputMode
  Element* volatile o_rows;  // o at the item's first token
  // o's tensor-store coordinates: the item's first token, value head, batch row,
  // and the rows of its last chunk.
  volatile int o_token, o_head, o_row, last_rows;
  // A chained piece's counter: to raise at the end, to wait for at the start.
  unsigned* volatile signal;
  unsigned* volatile wait;
  volatile unsigned wait_for;
};

// Shared memory of one CTA. 16-bit tiles are raw storage (the element types
// have constructors), typed by the accessors below. Every 16-bit tile is either
// TMA's 128-byte swizzled layout (mma::Swizzled128Tile: q, k, v, the output's
// tensor-store tile) or the core-matrix layout (mma::CoreTile: P and Tβ);
// ldmatrix reads either without bank conflicts and wgmma through a descriptor.
template <typename Element>
struct SharedStorage {
  static_assert(sizeof(Element) == 2, "16-bit tokens");
  // A stage's k and q as one [128 rows][128] swizzled tile, k's tokens rows
  // ..63 and q's rows 64..: each 64-feature column block holds k's rows, then
  // q's, so that [K; Q] is one wgmma operand of 128 rows (the state chain's
  // step 1: one m64n128k16 a key step instead of two m64n64k16).
  alignas(1024) uint16_t qk[kQKStages][2 * kChunk * kDim];
  alignas(1024) uint16_t v[kHandOverStages][kChunk * kDim];
  // O on its way out, two stages: [64 tokens][kLdO] by rows, or a state
  // warpgroup's [64 tokens][64 values] swizzled tile each for tensor stores.
  alignas(1024) union {
    uint16_t rows[kHandOverStages][kChunk * kLdO];
    uint16_t tensor[kHandOverStages][2][kChunk * kDim / 2];
  } o;
  // Pᵀ = (Q Kᵀ ⊙ Γ)ᵀ (read MN-major) and Tβ = T diag(β) (K-major), [64][64]
  // core-matrix tiles, the state chain's B operands; Tβ's tile holds T's 32x32
  // diagonal blocks times β and, in place of T's block below them, L_10 =
  // (K Kᵀ ⊙ Γ)'s (state_chain.cuh, step 2). Adjacent: zeroed once together.
  alignas(1024) uint16_t p[kHandOverStages][kChunk * kChunk];
  alignas(1024) uint16_t t_beta[kHandOverStages][kChunk * kChunk];
  // The producer's fp32 tile where it builds T's two 32x32 diagonal blocks in
  // place from A's; before the item starts, the whole-sequence ranking's scratch.
  alignas(1024) union {
    float t[kChunk * kLdF];
    int64_t ranking[kMaxRankedSequences + 1];
  } inverse;
  // Per-token gate vectors of a chunk (the producer's warp 2 writes them):
  // γ log2(e) (γ: the in-chunk cumsum of g), e^γ and e^{γ_C − γ} (γ_C: the
  // chunk's last γ) a q/k stage each; β a hand-over stage each (producer only).
  struct Gates {
    float gamma[kQKStages][kChunk];
    float exp_gamma[kQKStages][kChunk];
    float decay[kQKStages][kChunk];
    float beta[kHandOverStages][kChunk];
  } gates;
  ParkedItem<Element> parked;
  // The loads' completion: one mbarrier a q/k stage, one a v stage.
  alignas(8) uint64_t qk_loaded[kQKStages];
  uint64_t v_loaded[kHandOverStages];
  // Chunk c's hand-over to the state warpgroups, in stage c % 2, its use c / 2
  // (parity (c / 2) & 1): every producer thread arrives once its writes of the
  // stage are done (one arrival a thread, not a warp: compute-sanitizer's
  // racecheck takes an arrival as ordering only the arriving thread's own
  // accesses; as a named barrier, bar.arrive / bar.sync, it reported hazards
  // across it). The state warpgroups wait on the parity.
  uint64_t chunk_ready[kHandOverStages];

  using QKTile = mma::Swizzled128Tile<Element, 2 * kChunk>;
  using TokenTile = mma::Swizzled128Tile<Element, kChunk>;
  using OperandTile = mma::CoreTile<Element, kChunk>;
  // Chunk c's [K; Q] (its q the rows from 64).
  __device__ __forceinline__ QKTile k_tile(int64_t c) {
    return QKTile{reinterpret_cast<Element*>(qk[QKPipeline::of(c).index])};
  }
  __device__ __forceinline__ QKTile q_tile(int64_t c) { return QKTile{k_tile(c).base + kChunk * 64}; }
  __device__ __forceinline__ TokenTile v_tile(int stage) { return TokenTile{reinterpret_cast<Element*>(v[stage])}; }
  __device__ __forceinline__ OperandTile p_tile(int stage) {
    return OperandTile{reinterpret_cast<Element*>(p[stage])};
  }
  __device__ __forceinline__ OperandTile t_beta_tile(int stage) {
    return OperandTile{reinterpret_cast<Element*>(t_beta[stage])};
  }
  __device__ __forceinline__ Element* output_rows(int stage) { return reinterpret_cast<Element*>(o.rows[stage]); }
  __device__ __forceinline__ TokenTile output_tensor_tile(int stage, int warpgroup) {
    return TokenTile{reinterpret_cast<Element*>(o.tensor[stage][warpgroup])};
  }
};

template <typename Element>
constexpr int kSharedBytes = int(sizeof(SharedStorage<Element>));
static_assert(kSharedBytes<__nv_bfloat16> <= 227 * 1024, "shared memory of one CTA");
static_assert(offsetof(SharedStorage<__half>, t_beta) ==
                  offsetof(SharedStorage<__half>, p) + sizeof(SharedStorage<__half>::p),
              "P's and Tβ's stages adjacent (zeroed as one)");

}  // namespace flashqla::cuda::fused_fwd
