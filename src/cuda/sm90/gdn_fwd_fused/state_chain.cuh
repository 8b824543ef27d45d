// The fused forward's state chain (warpgroups 0 and 1): the serial per-chunk
// update of the state and the chunk's output. The state is kept transposed,
// Sᵀ [values][keys], and split by value rows: warpgroup w owns values 64 w..
// and runs its own chain, meeting the other only at the producer's barriers.
// S is the A operand (registers) of every state GEMM, each GEMM's accumulator
// the next one's A operand; W and U are never formed:
//   V_new = Tβ (V − e^γ ⊙ K S),  O = scale (e^γ ⊙ Q S + P V_new),
//   S ← e^{γ_C} S + (e^{γ_C − γ} ⊙ K)ᵀ V_new.
#pragma once

#include "cuda/forward_args.h"
#include "cuda/sm90/device_common.cuh"
#include "cuda/sm90/gdn_fwd_fused/kernel_layout.cuh"
#include "cuda/sm90/gdn_fwd_fused/output_epilogue.cuh"
#include "cuda/sm90/tma_load.cuh"
#include "cuda/sm90/warp_mma.cuh"
#include "cuda/sm90/warpgroup_mma.cuh"

namespace flashqla::cuda::fused_fwd {

template <typename Element>
struct StateChain {
  using M = mma::Mma<Element>;
  using Storage = SharedStorage<Element>;
  using OperandTile = typename Storage::OperandTile;
  using QKTile = typename Storage::QKTile;
  using TokenTile = typename Storage::TokenTile;

  Storage& s;
  const int lane, wr, v0;               // lane, warp in the warpgroup, the warpgroup's first value
  const int lane_group, lane_in_group;  // lane / 4 and lane % 4 (the mma fragment layouts)
  // Sᵀ in the wgmma accumulator layout (m64n128): s_acc[4 j + e] is value
  // v0 + 16 wr + lane_group + 8 (e / 2), key 8 j + 2 lane_in_group + e % 2.
  // The kernel's own array (an array member of the part itself is kept out of
  // registers in part: spills at the chunk loop's peak).
  float (&s_acc)[64];

  __device__ __forceinline__ StateChain(Storage& storage, float (&state)[64], int lane_id, int warp_in_group,
                                        int first_value)
      : s(storage), s_acc(state), lane(lane_id), wr(warp_in_group), v0(first_value), lane_group(lane_id >> 2),
        lane_in_group(lane_id & 3) {}

  __device__ __forceinline__ void load_start_state(const StateSource& init) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int v = v0 + 16 * wr + lane_group + ((i >> 1) & 1) * 8, k = 8 * (i >> 2) + 2 * lane_in_group + (i & 1);
      s_acc[i] = init.load(k, v);
    }
  }

  // An accumulator's 16 columns as an A fragment (16 bits), scaled by column:
  // the mma.sync A layout is the accumulator layout of two adjacent n8 tiles.
  __device__ __forceinline__ static void a_fragment(const float* d, float lo0, float hi0, float lo8, float hi8,
                                                    uint32_t (&f)[4]) {
    f[0] = M::pack(d[0] * lo0, d[1] * hi0);
    f[1] = M::pack(d[2] * lo0, d[3] * hi0);
    f[2] = M::pack(d[4] * lo8, d[5] * hi8);
    f[3] = M::pack(d[6] * lo8, d[7] * hi8);
  }

  // 1. [(K S)ᵀ | Oᵀ] = Sᵀ [K; Q]ᵀ (m64n128k128, A = Sᵀ in 16 bits, B = the
  // stage's [K; Q] K-major) into kq_acc (n8 tiles ..7: (K S)ᵀ, 8..: Oᵀ); then
  // Vᵀ's fragments (values 16 wr.. of the warpgroup's, tokens as K) through
  // ldmatrix.trans.
  __device__ __forceinline__ void project_state(QKTile ks, TokenTile vs, float (&kq_acc)[kChunk],
                                                uint32_t (&vf)[kChunk / 16][4]) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) kq_acc[i] = 0.f;
    // Batches of kKeyBlocks key blocks each, a batch's fragments made once the
    // previous one finished (fewer registers of fragments at the peak; the
    // other warpgroup's wgmmas fill the gaps).
    constexpr int kKeyBlocks = 4;
#pragma unroll
    for (int half = 0; half < kDim / 16 / kKeyBlocks; ++half) {
      uint32_t sf[kKeyBlocks][4];
#pragma unroll
      for (int kb = 0; kb < kKeyBlocks; ++kb) a_fragment(s_acc + 8 * (kKeyBlocks * half + kb), 1.f, 1.f, 1.f, 1.f, sf[kb]);
      wgmma::fence(kq_acc);
#pragma unroll
      for (int kb = 0; kb < kKeyBlocks; ++kb)
        wgmma::mma<Element, 2 * kChunk>(sf[kb], wgmma::kmajor_desc(ks, 16 * (kKeyBlocks * half + kb)), kq_acc);
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_operands(kq_acc);
    }
#pragma unroll
    for (int kb = 0; kb < kChunk / 16; ++kb) mma::load_a_trans(vf[kb], vs, v0 + 16 * wr, 16 * kb, lane);
  }

  // 2. V'ᵀ = Vᵀ − (K S)ᵀ diag(e^γ) and Oᵀ diag(e^γ), then V_new = Tβ V' by T's
  // 32x32 blocks, T's block below the diagonal never formed: with T_10 =
  // −T_11 A_10 T_00 and A_10 = diag(β_1) L_10,
  //   V_new,0 = (Tβ)_00 V'_0,  V_new,1 = (Tβ)_11 (V'_1 − L_10 V_new,0)
  // (tokens ..31 and 32..; L_10 in Tβ's tile below the diagonal). Transposed,
  // three m64n32 steps with B K-major from Tβ's tile: V_new,0ᵀ, then V'_1ᵀ −
  // V_new,0ᵀ L_10ᵀ accumulated onto V'_1ᵀ in fp32, then V_new,1ᵀ.
  // nv_acc: V_newᵀ, tokens ..31 in nv_acc[..15], 32.. in nv_acc[16..].
  __device__ __forceinline__ void new_values(float (&kq_acc)[kChunk], uint32_t (&vf)[kChunk / 16][4],
                                             const float* exp_gamma, OperandTile tb, float (&nv_acc)[kChunk / 2]) {
    float* const ks_acc = kq_acc;               // (K S)ᵀ
    float* const o_acc = kq_acc + kChunk / 2;   // Oᵀ
    auto token_half = [](float* d) -> float(&)[kChunk / 4] { return *reinterpret_cast<float(*)[kChunk / 4]>(d); };
    float x1[kChunk / 4];  // V'_1ᵀ in fp32 (accumulator layout, tokens 32..)
#pragma unroll
    for (int kb = 0; kb < kChunk / 16; ++kb) {
      const int c0 = 16 * kb + 2 * lane_in_group;
      const float2 e0 = *reinterpret_cast<const float2*>(exp_gamma + c0);
      const float2 e8 = *reinterpret_cast<const float2*>(exp_gamma + c0 + 8);
      const float* d = ks_acc + 8 * kb;
      float* o = o_acc + 8 * kb;  // Oᵀ diag(e^γ), with the same factors
      const float sc[8] = {e0.x, e0.y, e0.x, e0.y, e8.x, e8.y, e8.x, e8.y};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 v = M::unpack(vf[kb][q]);
        const float x0 = v.x - d[2 * q] * sc[2 * q], x1_ = v.y - d[2 * q + 1] * sc[2 * q + 1];
        if (kb < 2) {
          vf[kb][q] = M::pack(x0, x1_);
        } else {
          x1[8 * (kb - 2) + 2 * q] = x0;
          x1[8 * (kb - 2) + 2 * q + 1] = x1_;
        }
        o[2 * q] *= sc[2 * q], o[2 * q + 1] *= sc[2 * q + 1];
      }
      if (kb == 1) {  // V_new,0ᵀ = V'_0ᵀ (Tβ)_00ᵀ, running while the rest is formed
#pragma unroll
        for (int i = 0; i < kChunk / 2; ++i) nv_acc[i] = 0.f;
        wgmma::fence(token_half(nv_acc));
#pragma unroll
        for (int k = 0; k < 2; ++k) wgmma::mma<Element, kChunk / 2>(vf[k], wgmma::kmajor_desc(tb, 16 * k), token_half(nv_acc));
        wgmma::commit();
      }
    }
    wgmma::wait<0>();
    wgmma::fence_operands(token_half(nv_acc));
    // V'_1ᵀ −= V_new,0ᵀ L_10ᵀ (A = −V_new,0ᵀ in 16 bits).
    uint32_t uf[2][4];
#pragma unroll
    for (int k = 0; k < 2; ++k) a_fragment(nv_acc + 8 * k, -1.f, -1.f, -1.f, -1.f, uf[k]);
    wgmma::fence(x1);
#pragma unroll
    for (int k = 0; k < 2; ++k) wgmma::mma<Element, kChunk / 2>(uf[k], wgmma::kmajor_desc(tb, 16 * k, 32), x1);
    wgmma::commit_and_wait(x1);
    // V_new,1ᵀ = (V'_1 − L_10 V_new,0)ᵀ (Tβ)_11ᵀ.
#pragma unroll
    for (int k = 0; k < 2; ++k) a_fragment(x1 + 8 * k, 1.f, 1.f, 1.f, 1.f, vf[2 + k]);
    wgmma::fence(token_half(nv_acc + kChunk / 4));
#pragma unroll
    for (int k = 0; k < 2; ++k)
      wgmma::mma<Element, kChunk / 2>(vf[2 + k], wgmma::kmajor_desc(tb, 32 + 16 * k, 32), token_half(nv_acc + kChunk / 4));
    wgmma::commit_and_wait(token_half(nv_acc + kChunk / 4));
  }

  // 3. Sᵀ = e^{γ_C} Sᵀ + (V_newᵀ diag(e^{γ_C − γ})) K (B = K MN-major), then
  // Oᵀ += V_newᵀ Pᵀ (B = Pᵀ MN-major, the producer's): issued and committed;
  // the caller waits (finish_update) once the previous chunk's rows are out.
  __device__ __forceinline__ void issue_update(QKTile ks, OperandTile pt, const float* exp_gamma, const float* decay,
                                               float (&nv_acc)[kChunk / 2], float (&o_acc)[kChunk / 2]) {
    uint32_t nf[kChunk / 16][4], nd[kChunk / 16][4];
#pragma unroll
    for (int kb = 0; kb < kChunk / 16; ++kb) {
      const int c0 = 16 * kb + 2 * lane_in_group;
      const float2 d0 = *reinterpret_cast<const float2*>(decay + c0);
      const float2 d8 = *reinterpret_cast<const float2*>(decay + c0 + 8);
      a_fragment(nv_acc + 8 * kb, d0.x, d0.y, d8.x, d8.y, nd[kb]);
    }
    const float e_last = exp_gamma[kChunk - 1];
#pragma unroll
    for (int i = 0; i < 64; ++i) s_acc[i] *= e_last;
    wgmma::fence(s_acc);
#pragma unroll
    for (int kb = 0; kb < kChunk / 16; ++kb) wgmma::mma_b_mn<Element, kDim>(nd[kb], wgmma::mnmajor_desc(ks, 16 * kb), s_acc);
    wgmma::commit();
#pragma unroll
    for (int kb = 0; kb < kChunk / 16; ++kb) a_fragment(nv_acc + 8 * kb, 1.f, 1.f, 1.f, 1.f, nf[kb]);
    wgmma::fence(o_acc);
#pragma unroll
    for (int kb = 0; kb < kChunk / 16; ++kb) wgmma::mma_b_mn<Element, kChunk>(nf[kb], wgmma::mnmajor_desc(pt, 16 * kb), o_acc);
    wgmma::commit();
  }
  __device__ __forceinline__ void finish_update(float (&o_acc)[kChunk / 2]) {
    wgmma::wait<0>();
    wgmma::fence_operands(o_acc);
    wgmma::fence_operands(s_acc);
  }

  // After chunk c of nc: the state to its checkpoint row when the sequence's
  // chunks done so far are a multiple of the interval (and the chunk whole:
  // a partial chunk ends the sequence short of the next checkpoint).
  __device__ __forceinline__ void store_checkpoint(int c, int nc) const {
    const StateTarget& parked = s.parked.checkpoints;
    const int64_t done = s.parked.checkpoint_done + c + 1, every = s.parked.checkpoint_every;
    if (parked.ptr == nullptr || done % every != 0 || (c == nc - 1 && s.parked.last_rows < kChunk)) return;
    StateTarget t = parked;
    t.base += (done / every - 1) * s.parked.checkpoint_rows;
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int v = v0 + 16 * wr + lane_group + ((i >> 1) & 1) * 8, k = 8 * (i >> 2) + 2 * lane_in_group + (i & 1);
      t.store(k, v, s_acc[i]);
    }
  }

  // The chunk loop over nc chunks, each handed over by the producer
  // (kCheckpoints: the kernel's instance that writes state checkpoints).
  template <bool kCheckpoints>
  __device__ __forceinline__ void run(int nc, const OutputEpilogue<Element>& output) {
    for (int c = 0; c < nc; ++c) {
      const int stage = c & 1;
      output.before_chunk();
      tma::wait(s.chunk_ready + stage, uint32_t(c >> 1) & 1u);
      const int qk_stage = QKPipeline::of(c).index;
      const QKTile ks = s.k_tile(c);  // [K; Q]
      const float* const exp_gamma = s.gates.exp_gamma[qk_stage];  // e^γ
      const float* const decay = s.gates.decay[qk_stage];          // e^{γ_C − γ}

      float kq_acc[kChunk];  // n8 tiles ..7: (K S)ᵀ, 8..: Oᵀ
      float(&o_acc)[kChunk / 2] = *reinterpret_cast<float(*)[kChunk / 2]>(kq_acc + kChunk / 2);
      uint32_t vf[kChunk / 16][4];
      project_state(ks, s.v_tile(stage), kq_acc, vf);
      asm volatile("" ::: "memory");  // the next step's shared-memory loads stay in it
      float nv_acc[kChunk / 2];
      new_values(kq_acc, vf, exp_gamma, s.t_beta_tile(stage), nv_acc);
      asm volatile("" ::: "memory");  // the next step's shared-memory loads stay in it
      issue_update(ks, s.p_tile(stage), exp_gamma, decay, nv_acc, o_acc);
      output.store_previous_rows(c);
      finish_update(o_acc);
      // This stage (q, k, v, gates, P, Tβ) is no longer read: the producer may refill it.
      StageFree::arrive(stage);
      // 4. O to the output tile and on to o.
      output.write_chunk(o_acc, stage, c, nc);
      if constexpr (kCheckpoints) store_checkpoint(c, nc);
    }
    output.finish(nc);
  }
};

}  // namespace flashqla::cuda::fused_fwd
