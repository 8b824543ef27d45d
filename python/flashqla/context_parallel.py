"""Context parallelism: one sequence split across the ranks of a process group.

Rank r holds tokens [t_r, t_{r+1}) of one sequence (B = 1, no ``cu_seqlens``; the
shards need not be chunk-aligned or equal). The recurrence is affine in the state a
shard starts from (docs/design.md §5.2, ``src/cpu/piecewise_reference.cpp``):

    S_end(r) = M_r S_start(r) + S_local(r)

with M_r the shard's transition (its end state from the identity with v = 0) and
S_local(r) its end state from zero. The forward computes both on each rank, all-gathers
them (K×K + K×V a value head and rank), composes every rank's true start state in
order, and reruns its shard from it. The backward is the same in reverse: the gradient
reaching a shard's start, dS_start(r) = M_rᵀ dS_end(r) + dS_local(r), with dS_local(r)
the shard's d_initial_state when no gradient reaches its end; all-gathered, composed
from the last rank back, and each shard's backward rerun with its true dS_end. Exact
(to rounding) for any split; three forward and two backward calls a shard.

The collectives are ``torch.distributed.all_gather`` on the group (gloo on CPUs, NCCL on
GPUs); communication is not overlapped with compute yet.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .gated_delta_rule import chunk_gated_delta_rule_bwd, chunk_gated_delta_rule_fwd


def _gather(x: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's x, in rank order (through the host where the group is gloo and x on a GPU)."""
    via_host = x.is_cuda and dist.get_backend(group) == "gloo"
    y = x.detach().cpu() if via_host else x.contiguous()
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, y, group=group)
    return [p.to(x.device) for p in parts] if via_host else parts


def _transition(q, k, g, beta, scale, K, flags):
    """M: the shard's end state from the identity with v = 0, [1, HV, K, K] (fp32, fp64 inputs: fp64)."""
    HV = g.shape[2]
    state_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    eye = torch.eye(K, dtype=state_dtype, device=q.device).expand(1, HV, K, K).contiguous()
    v0 = torch.zeros(q.shape[0], q.shape[1], HV, K, dtype=q.dtype, device=q.device)
    _, m = chunk_gated_delta_rule_fwd(q, k, v0, g, beta, scale, eye, True, **flags)
    return m


def _start_states(m_all, local_all, h0):
    """S_start of every rank: S_start(0) = h0, S_start(r + 1) = M_r S_start(r) + S_local(r)."""
    starts = [h0]
    for r in range(len(m_all) - 1):
        starts.append(torch.matmul(m_all[r], starts[-1]) + local_all[r])
    return starts


class _ContextParallelGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, scale, flags, group, output_final_state):
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        K, V, HV = q.shape[-1], v.shape[-1], v.shape[2]
        state_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        zero = torch.zeros(1, HV, K, V, dtype=state_dtype, device=q.device)
        _, local = chunk_gated_delta_rule_fwd(q, k, v, g, beta, scale, zero, True, **flags)
        m = _transition(q, k, g, beta, scale, K, flags)
        m_all, local_all = _gather(m, group), _gather(local, group)
        start = _start_states(m_all, local_all, h0.to(state_dtype) if h0 is not None else zero)[rank]
        o, end = chunk_gated_delta_rule_fwd(q, k, v, g, beta, scale, start, True, **flags)
        # The sequence's final state is the last rank's end state, on every rank.
        final = _gather(end, group)[world - 1] if output_final_state else None
        ctx.save_for_backward(q, k, v, g, beta, start)
        ctx.m_all, ctx.scale, ctx.flags, ctx.group = m_all, scale, flags, group
        ctx.h0_given, ctx.h0_dtype = h0 is not None, (h0.dtype if h0 is not None else None)
        return o, final

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, start = ctx.saved_tensors
        group, rank = ctx.group, dist.get_rank(ctx.group)
        world = dist.get_world_size(group)
        if do is None:
            do = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
        zero = torch.zeros_like(start)
        # dS_local: the gradient reaching this shard's start from its own outputs.
        *_, ds_local = chunk_gated_delta_rule_bwd(q, k, v, g, beta, ctx.scale, start, do, zero, **ctx.flags)
        ds_local_all = _gather(ds_local, group)
        # dS_end(world - 1) = dht; dS_end(r) = M_{r+1}ᵀ dS_end(r + 1) + dS_local(r + 1).
        ends = [None] * world
        ends[world - 1] = dht.to(start.dtype) if dht is not None else zero
        for r in range(world - 2, -1, -1):
            ends[r] = torch.matmul(ctx.m_all[r + 1].transpose(-1, -2), ends[r + 1]) + ds_local_all[r + 1]
        dq, dk, dv, dg, dbeta, dh0 = chunk_gated_delta_rule_bwd(q, k, v, g, beta, ctx.scale, start, do, ends[rank],
                                                                **ctx.flags)
        # The initial state belongs to rank 0's shard; every rank returns the same dh0
        # (rank 0's), as every rank passed the same h0.
        dh0_all = _gather(dh0, group)[0] if ctx.h0_given else None
        dh0_out = dh0_all.to(ctx.h0_dtype) if dh0_all is not None else None
        return dq, dk, dv, dg, dbeta, dh0_out, None, None, None, None


def chunk_gated_delta_rule_cp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    group=None,
):
    r"""GDN over one sequence split across the ranks of ``group`` (default: the world).

    Every rank calls it with its own shard, in rank order along the sequence: q, k
    ``[1, T_r, H, K]``, v ``[1, T_r, HV, V]``, g and beta ``[1, T_r, HV]`` (any T_r ≥ 0,
    K-first states). ``initial_state`` ``[1, HV, K, V]``, the sequence's, is passed the
    same on every rank (rank 0's shard starts from it) or on none. Returns this rank's
    o ``[1, T_r, HV, V]`` and, with ``output_final_state``, the sequence's final state
    (on every rank). Autograd: each rank gets the gradients of its shard's inputs, and
    every rank the gradient of ``initial_state``.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashqla: chunk_gated_delta_rule_cp needs an initialised torch.distributed process group")
    if q.dim() != 4 or q.shape[0] != 1:
        raise ValueError(f"flashqla: chunk_gated_delta_rule_cp takes one sequence a call, q [1, T, H, K]; got q of "
                         f"shape {tuple(q.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (1, v.shape[2], q.shape[-1], v.shape[-1]):
        raise ValueError(f"flashqla: initial_state must be [1, HV, K, V] = {(1, v.shape[2], q.shape[-1], v.shape[-1])}"
                         f"; got {tuple(initial_state.shape)}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    flags = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 allow_neg_eigval=allow_neg_eigval)
    group = group if group is not None else dist.group.WORLD
    o, final = _ContextParallelGDN.apply(q, k, v, g, beta, initial_state, float(scale), flags, group,
                                         bool(output_final_state))
    return (o, final) if output_final_state else (o, None)
