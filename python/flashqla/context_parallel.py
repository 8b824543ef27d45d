"""Context parallelism: one sequence, or a packed batch of sequences, split across the
ranks of a process group.

Rank r holds tokens [t_r, t_{r+1}) of the packed batch (rank order along the tokens;
any split: not chunk-aligned, uneven, empty shards). A sequence crossing shard
boundaries is cut into segments, one a rank. The recurrence is affine in the state a
segment starts from (docs/design.md §5.2, ``src/cpu/piecewise_reference.cpp``):

    S_end = M S_start + S_local

with M the segment's transition (its end state from the identity with v = 0) and
S_local its end state from zero. Forward: each rank runs its shard with the states it
knows (a continued first segment from zero), computes the transition of a segment that
crosses the whole shard, all-gathers (M, end state of its last segment) — K×K + K×V a
value head and rank — composes the state entering every continued segment in rank
order, and reruns its shard from them. Backward, the same in reverse: the gradient
reaching a continued segment's start, dS_start = Mᵀ dS_end + dS_local, all-gathered and
composed from the last rank back, then each shard's backward rerun with the gradients
reaching its segments' ends. Exact to rounding; at most three forward and two backward
calls a shard, each on the library's own kernels.

Collectives: ``torch.distributed.all_gather`` on the group (gloo on CPUs, NCCL on
GPUs; a gloo group gathers GPU tensors through the host); not overlapped with compute.
"""

from __future__ import annotations

from dataclasses import dataclass
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


@dataclass
class _Shard:
    """This rank's segments: (sequence, local first token, local end, starts here, ends here)."""
    segments: list
    local_cu: list          # the segments' offsets in the shard
    first_continued: bool   # the first segment continues a sequence from the previous rank
    last_continues: bool    # the last segment's sequence goes on on the next rank
    crossing: bool          # one segment, continued from before and going on after (or no tokens)

    @staticmethod
    def of(cu: list, a: int, b: int) -> "_Shard":
        segs = []
        for n in range(len(cu) - 1):
            bos, eos = cu[n], cu[n + 1]
            lo, hi = max(bos, a), min(eos, b)
            if lo < hi:
                segs.append((n, lo - a, hi - a, bos >= a, eos <= b))
        first_cont = bool(segs) and not segs[0][3]
        last_cont = bool(segs) and not segs[-1][4]
        return _Shard(segs, [0] + [s[2] for s in segs], first_cont, last_cont,
                      not segs or (len(segs) == 1 and first_cont and last_cont))


def _run_fwd(x, h0, shard, scale, flags):
    cu = torch.tensor(shard.local_cu, dtype=torch.int64)
    return chunk_gated_delta_rule_fwd(x[0], x[1], x[2], x[3], x[4], scale, h0, True, cu_seqlens=cu.to(x[0].device),
                                      cu_seqlens_cpu=cu, **flags)


def _run_bwd(x, h0, do, dht, shard, scale, flags):
    cu = torch.tensor(shard.local_cu, dtype=torch.int64)
    return chunk_gated_delta_rule_bwd(x[0], x[1], x[2], x[3], x[4], scale, h0, do, dht, cu_seqlens=cu.to(x[0].device),
                                      cu_seqlens_cpu=cu, **flags)


def _transition(x, hi, scale, flags, state_dtype):
    """The transition of the shard's first hi tokens (one segment), [HV, K, K]."""
    q, k, g, beta = x[0][:, :hi], x[1][:, :hi], x[3][:, :hi], x[4][:, :hi]
    HV, K = g.shape[2], q.shape[-1]
    eye = torch.eye(K, dtype=state_dtype, device=q.device).expand(1, HV, K, K).contiguous()
    v0 = torch.zeros(1, hi, HV, K, dtype=q.dtype, device=q.device)
    _, m = chunk_gated_delta_rule_fwd(q, k, v0, g, beta, scale, eye, True, **flags)
    return m[0]


class _ContextParallelGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, scale, flags, group, cu, a, b, output_final_state):
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        N, HV, K, V = len(cu) - 1, v.shape[2], q.shape[-1], v.shape[-1]
        state_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        dev = q.device
        x = (q, k, v, g, beta)
        shard = _Shard.of(cu, a, b)
        S = len(shard.segments)
        # The segments' start states as far as this rank knows them (a continued one from zero).
        starts = torch.zeros(S, HV, K, V, dtype=state_dtype, device=dev)
        for j, (n, *_rest, starts_here, _) in enumerate(shard.segments):
            if starts_here and h0 is not None:
                starts[j] = h0[n].to(state_dtype)
        o, ends = _run_fwd(x, starts, shard, scale, flags) if S else (torch.empty(v.shape, dtype=q.dtype, device=dev), None)
        m = torch.eye(K, dtype=state_dtype, device=dev).expand(HV, K, K).contiguous()
        last_end = torch.zeros(HV, K, V, dtype=state_dtype, device=dev)
        if S and shard.crossing:
            m = _transition(x, shard.segments[0][2], scale, flags, state_dtype)
        if S and shard.last_continues:
            last_end = ends[-1]
        flags_t = torch.tensor([shard.crossing, shard.first_continued, shard.last_continues], dtype=torch.int64,
                               device=dev)
        m_all, end_all = _gather(m, group), _gather(last_end, group)
        f_all = [f.tolist() for f in _gather(flags_t, group)]  # every rank's (crossing, first, last)
        # The state entering each rank's first segment where it is continued.
        carried = [None] * world
        for r in range(1, world):
            crossing_prev, _, cont_prev = f_all[r - 1]
            if crossing_prev:  # through the previous shard (or past an empty one)
                if carried[r - 1] is not None:
                    carried[r] = torch.matmul(m_all[r - 1], carried[r - 1]) + end_all[r - 1]
            elif cont_prev:
                carried[r] = end_all[r - 1]
        if S and shard.first_continued:  # rerun from the state it continues
            starts[0] = carried[rank]
            o, ends = _run_fwd(x, starts, shard, scale, flags)
        final = None
        if output_final_state:
            mine = torch.zeros(N, HV, K, V, dtype=state_dtype, device=dev)
            for j, (n, _lo, _hi, _s, ends_here) in enumerate(shard.segments):
                if ends_here:
                    mine[n] = ends[j]
            final = torch.stack(_gather(mine, group)).sum(0)  # each sequence ends on one rank
            for n in range(N):
                if cu[n + 1] <= cu[n]:  # an empty sequence: its final state is its initial one
                    final[n] = h0[n].to(state_dtype) if h0 is not None else 0
        ctx.save_for_backward(q, k, v, g, beta, starts)
        # The backward composes with the same transitions and layout: kept, not gathered again.
        ctx.shard, ctx.m_all, ctx.f_all, ctx.cu = shard, m_all, f_all, cu
        ctx.scale, ctx.flags, ctx.group = scale, flags, group
        ctx.h0_dtype = h0.dtype if h0 is not None else None
        return o, final

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, starts = ctx.saved_tensors
        shard, group, cu = ctx.shard, ctx.group, ctx.cu
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        x = (q, k, v, g, beta)
        S, N = len(shard.segments), len(cu) - 1
        dev, state_dtype = q.device, starts.dtype
        HV, K, V = v.shape[2], q.shape[-1], v.shape[-1]
        if do is None:
            do = torch.zeros(v.shape, dtype=v.dtype, device=dev)
        # The gradients reaching the segments' ends as far as this rank knows them.
        dends = torch.zeros(S, HV, K, V, dtype=state_dtype, device=dev)
        for j, (n, _lo, _hi, _s, ends_here) in enumerate(shard.segments):
            if ends_here and dht is not None:
                dends[j] = dht[n].to(state_dtype)
        first_grad = torch.zeros(HV, K, V, dtype=state_dtype, device=dev)
        if S and shard.first_continued:
            first_grad = _run_bwd(x, starts, do, dends, shard, ctx.scale, ctx.flags)[5][0]
        fg_all, f_all, m_all = _gather(first_grad, group), ctx.f_all, ctx.m_all
        # From the last rank back: the gradient reaching each rank's continued last segment's end.
        into_first = [None] * (world + 1)  # gradient reaching rank r's continued first segment's start
        reaching_end = [None] * world
        for r in range(world - 1, -1, -1):
            crossing, first_cont, last_cont = f_all[r]
            reaching_end[r] = into_first[r + 1] if last_cont or crossing else None
            if crossing:
                if reaching_end[r] is not None and first_cont:
                    into_first[r] = torch.matmul(m_all[r].transpose(-1, -2), reaching_end[r]) + fg_all[r]
                elif first_cont:
                    into_first[r] = fg_all[r]
                else:  # no tokens: passes through
                    into_first[r] = reaching_end[r]
            elif first_cont:
                into_first[r] = fg_all[r]
        if S and shard.last_continues and reaching_end[rank] is not None:
            dends[-1] = reaching_end[rank]
        if S:
            dq, dk, dv, dg, dbeta, dstarts = _run_bwd(x, starts, do, dends, shard, ctx.scale, ctx.flags)
        else:
            dq, dk, dv, dg, dbeta = (torch.zeros_like(t) for t in (q, k, v, g, beta))
            dstarts = None
        dh0 = None
        if ctx.h0_dtype is not None:
            mine = torch.zeros(N, HV, K, V, dtype=state_dtype, device=dev)
            for j, (n, _lo, _hi, starts_here, _e) in enumerate(shard.segments):
                if starts_here:
                    mine[n] = dstarts[j]
            dh0 = torch.stack(_gather(mine, group)).sum(0)
            for n in range(N):
                if cu[n + 1] <= cu[n] and dht is not None:  # an empty sequence passes its gradient on
                    dh0[n] = dht[n].to(state_dtype)
            dh0 = dh0.to(ctx.h0_dtype)
        return dq, dk, dv, dg, dbeta, dh0, None, None, None, None, None, None, None


def chunk_gated_delta_rule_cp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens=None,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    group=None,
):
    r"""GDN over one sequence, or a packed batch, split across the ranks of ``group``.

    Every rank calls it with its own shard, in rank order along the (packed) tokens: q, k
    ``[1, T_r, H, K]``, v ``[1, T_r, HV, V]``, g and beta ``[1, T_r, HV]`` (any T_r ≥ 0,
    K-first states). ``cu_seqlens``: the whole batch's sequence offsets (a list or a
    tensor, the same on every rank; the host reads them), ``None`` for one sequence.
    ``initial_state`` ``[N, HV, K, V]``, the batch's, passed the same on every rank or on
    none. Returns this rank's o ``[1, T_r, HV, V]`` and, with ``output_final_state``, the
    batch's final states ``[N, HV, K, V]`` (on every rank). Autograd: each rank gets the
    gradients of its shard's inputs, and every rank the gradient of ``initial_state``.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashqla: chunk_gated_delta_rule_cp needs an initialised torch.distributed process group")
    if q.dim() != 4 or q.shape[0] != 1:
        raise ValueError(f"flashqla: chunk_gated_delta_rule_cp takes a packed shard, q [1, T, H, K]; got q of shape "
                         f"{tuple(q.shape)}")
    group = group if group is not None else dist.group.WORLD
    lengths = [int(t) for t in _gather(torch.tensor([q.shape[1]], dtype=torch.int64, device=q.device), group)]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    rank = dist.get_rank(group)
    if cu_seqlens is None:
        cu = [0, offsets[-1]]
    else:
        cu = [int(c) for c in (cu_seqlens.tolist() if torch.is_tensor(cu_seqlens) else cu_seqlens)]
        if cu[0] != 0 or cu[-1] != offsets[-1] or any(x > y for x, y in zip(cu, cu[1:])):
            raise ValueError(f"flashqla: cu_seqlens must rise from 0 to the shards' total of {offsets[-1]} tokens; "
                             f"got {cu}")
    N, HV, K, V = len(cu) - 1, v.shape[2], q.shape[-1], v.shape[-1]
    if initial_state is not None and tuple(initial_state.shape) != (N, HV, K, V):
        raise ValueError(f"flashqla: initial_state must be [N, HV, K, V] = {(N, HV, K, V)}; got "
                         f"{tuple(initial_state.shape)}")
    if scale is None:
        scale = K ** -0.5
    flags = dict(use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
                 allow_neg_eigval=allow_neg_eigval)
    o, final = _ContextParallelGDN.apply(q, k, v, g, beta, initial_state, float(scale), flags, group, cu,
                                         offsets[rank], offsets[rank + 1], bool(output_final_state))
    return (o, final) if output_final_state else (o, None)
