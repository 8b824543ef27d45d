"""Context parallelism: one sequence, or a packed batch of sequences, split across the
ranks of a process group.

Two entries share one machinery. ``chunk_gated_delta_rule_cp`` takes the whole batch's
``cu_seqlens`` and rank r holds tokens [t_r, t_{r+1}) of the packed batch (rank order
along the tokens; any split: not chunk-aligned, uneven, empty shards).
``flashqla.chunk_gated_delta_rule(..., cp_context=ctx)`` takes FLA's context instead
(``fla.ops.cp.FLACPContext``: the rank's local ``cu_seqlens`` and where its first and
last sequences continue); with FLA's ``'zigzag'`` layout rank r holds two of the 2W
equal intervals, r and 2W−1−r, one after the other in its buffer.

Either way a rank holds pieces — runs of consecutive packed tokens, each at a position
of the chain of intervals that tiles the batch — and a sequence crossing piece
boundaries is cut into segments, one a piece. The recurrence is affine in the state a
segment starts from (docs/design.md §5.2, ``src/cpu/piecewise_reference.cpp``):

    S_end = M S_start + S_local

with M the segment's transition (its end state from the identity with v = 0) and
S_local its end state from zero. Forward: each rank runs its pieces with the states it
knows (a continued first segment from zero), computes the transition of a segment that
crosses a whole piece, all-gathers (M, end state of the piece's last segment) — K×K +
K×V a value head and piece — composes the state entering every continued segment in
chain order, and reruns its pieces from them. Backward, the same in reverse: the
gradient reaching a continued segment's start, dS_start = Mᵀ dS_end + dS_local,
all-gathered and composed from the chain's end back, then each rank's backward rerun
with the gradients reaching its segments' ends. Exact to rounding; at most three forward
calls a rank (four where a sequence crosses both its pieces whole) and two backward,
each on the library's own kernels.

Collectives: ``torch.distributed.all_gather`` on the group (gloo on CPUs, NCCL on
GPUs; a gloo group gathers GPU tensors through the host); not overlapped with compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from . import ops
from .gated_delta_rule import chunk_gated_delta_rule_bwd, chunk_gated_delta_rule_fwd


def _gather(x: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's x, in rank order (through the host where the group is gloo and x on a GPU)."""
    via_host = x.is_cuda and dist.get_backend(group) == "gloo"
    y = x.detach().cpu() if via_host else x.contiguous()
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, y, group=group)
    return [p.to(x.device) for p in parts] if via_host else parts


@dataclass
class _Piece:
    """A run of consecutive packed tokens this rank holds, at one position of the chain."""
    chain: int              # its position in the chain (rank order; FLA's zigzag: r and 2W-1-r)
    first: int              # index of its first segment in the plan
    count: int              # its segments (0: no tokens)
    first_continued: bool   # its first segment continues a sequence from the chain's previous piece
    last_continues: bool    # its last segment's sequence goes on in the next piece
    pre: int = -1           # what an FLA context declares (pre_num_ranks / post_num_ranks): pieces
    post: int = -1          # the first / last sequence spans before / after this one (-1: nothing declared)
    checked: bool = False   # from an FLA context: the chain's flags are checked against each other

    @property
    def crossing(self) -> bool:
        """One segment, continued from before and going on after (or no tokens): passes a state through."""
        return self.count == 0 or (self.count == 1 and self.first_continued and self.last_continues)


@dataclass
class _Plan:
    """This rank's segments and pieces. A segment is (row, lo, hi, starts here, ends here):
    one sequence's tokens [lo, hi) of this rank's buffer (lo < hi; the segments tile the
    buffer in order), row its row of initial_state and of the final state."""
    segments: list
    pieces: list
    rows: int                # rows of initial_state / final state
    empty_rows: list         # rows of sequences without tokens (final state = initial state)
    local_rows: bool         # rows are this rank's sequences (FLA's cp_context), not the whole batch's

    @property
    def local_cu(self) -> list:
        return [0] + [s[2] for s in self.segments]


def _global_plan(cu: list, a: int, b: int, rank: int) -> _Plan:
    """Tokens [a, b) of the batch with offsets cu (the whole batch's), at chain position rank."""
    segs = []
    for n in range(len(cu) - 1):
        bos, eos = cu[n], cu[n + 1]
        lo, hi = max(bos, a), min(eos, b)
        if lo < hi:
            segs.append((n, lo - a, hi - a, bos >= a, eos <= b))
    piece = _Piece(rank, 0, len(segs), bool(segs) and not segs[0][3], bool(segs) and not segs[-1][4])
    return _Plan(segs, [piece], len(cu) - 1, [n for n in range(len(cu) - 1) if cu[n + 1] <= cu[n]], False)


def _run_fwd(x, h0, plan, scale, flags):
    cu = torch.tensor(plan.local_cu, dtype=torch.int64)
    return chunk_gated_delta_rule_fwd(x[0], x[1], x[2], x[3], x[4], scale, h0, True, cu_seqlens=cu.to(x[0].device),
                                      cu_seqlens_cpu=cu, **flags)


def _run_bwd(x, h0, do, dht, plan, scale, flags):
    cu = torch.tensor(plan.local_cu, dtype=torch.int64)
    return chunk_gated_delta_rule_bwd(x[0], x[1], x[2], x[3], x[4], scale, h0, do, dht, cu_seqlens=cu.to(x[0].device),
                                      cu_seqlens_cpu=cu, **flags)


def _transition(x, lo, hi, scale, flags, state_dtype):
    """The transition of tokens [lo, hi) of the buffer (one segment), [HV, K, K]."""
    q, k, g, beta = x[0][:, lo:hi], x[1][:, lo:hi], x[3][:, lo:hi], x[4][:, lo:hi]
    HV, K = g.shape[2], q.shape[-1]
    eye = torch.eye(K, dtype=state_dtype, device=q.device).expand(1, HV, K, K).contiguous()
    v0 = torch.zeros(1, hi - lo, HV, K, dtype=q.dtype, device=q.device)
    _, m = chunk_gated_delta_rule_fwd(q, k, v0, g, beta, scale, eye, True, **flags)
    return m[0]


def _chain_order(info_all: list) -> list:
    """(rank, piece) at each chain position, from every rank's gathered piece flags
    (crossing, first continued, last continues, chain position, pre, post, checked); raises
    ValueError, on every rank alike, where FLA contexts do not fit together."""
    where = {}
    for r, infos in enumerate(info_all):
        for p, info in enumerate(infos):
            where.setdefault(info[3], []).append((r, p))
    C = sum(len(infos) for infos in info_all)
    if sorted(where) != list(range(C)):
        raise ValueError(f"flashqla: the ranks' cp_context do not tile the batch: chain positions "
                         f"{sorted(info[3] for infos in info_all for info in infos)} held (rank order), expected each "
                         f"of 0..{C - 1} once (a context built for another group size or layout?)")
    order = [where[c][0] for c in range(C)]
    flags = [info_all[r][p] for r, p in order]
    if not any(f[6] for f in flags):
        return order

    def who(c):
        return f"rank {order[c][0]} (chain position {c} of {C})"

    pre, post = [0] * C, [0] * C
    for c in range(C):
        first_cont = flags[c][1]
        if c == 0 and first_cont:
            raise ValueError(f"flashqla: the ranks' cp_context do not fit together: {who(c)} holds the batch's first "
                             f"tokens but says its first sequence continues from a previous rank")
        if c > 0 and bool(first_cont) != bool(flags[c - 1][2]):
            raise ValueError(f"flashqla: the ranks' cp_context do not fit together: {who(c)} says its first sequence "
                             f"{'continues from' if first_cont else 'does not continue from'} {who(c - 1)}, which says "
                             f"its last sequence {'goes on' if flags[c - 1][2] else 'ends there'}")
        pre[c] = 0 if not first_cont else 1 + (pre[c - 1] if flags[c - 1][0] else 0)
    if flags[-1][2]:
        raise ValueError(f"flashqla: the ranks' cp_context do not fit together: {who(C - 1)} holds the batch's last "
                         f"tokens but says its last sequence goes on")
    for c in range(C - 1, -1, -1):
        post[c] = 0 if not flags[c][2] else 1 + (post[c + 1] if flags[c + 1][0] else 0)
    for c in range(C):
        for name, declared, actual in (("pre_num_ranks", flags[c][4], pre[c]),
                                       ("post_num_ranks", flags[c][5], post[c])):
            if declared >= 0 and declared != actual:
                raise ValueError(f"flashqla: the ranks' cp_context do not fit together: {who(c)} has {name} = "
                                 f"{declared}, but the ranks' first/last flags give {actual}")
    return order


class _ContextParallelGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, scale, flags, group, plan, output_final_state):
        HV, K, V = v.shape[2], q.shape[-1], v.shape[-1]
        state_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        dev = q.device
        x = (q, k, v, g, beta)
        segs, pieces = plan.segments, plan.pieces
        S, P = len(segs), len(pieces)
        # The segments' start states as far as this rank knows them (a continued one from zero).
        starts = torch.zeros(S, HV, K, V, dtype=state_dtype, device=dev)
        if h0 is not None:
            for j, (row, _lo, _hi, starts_here, _e) in enumerate(segs):
                if starts_here:
                    starts[j] = h0[row].to(state_dtype)
        if S:
            o, ends = _run_fwd(x, starts, plan, scale, flags)
        else:
            o, ends = torch.empty(v.shape, dtype=q.dtype, device=dev), None
        m = torch.eye(K, dtype=state_dtype, device=dev).expand(P, HV, K, K).contiguous()
        last_end = torch.zeros(P, HV, K, V, dtype=state_dtype, device=dev)
        for p, pc in enumerate(pieces):
            if pc.count and pc.crossing:
                m[p] = _transition(x, segs[pc.first][1], segs[pc.first][2], scale, flags, state_dtype)
            if pc.count and pc.last_continues:
                last_end[p] = ends[pc.first + pc.count - 1]
        info = torch.tensor([[pc.crossing, pc.first_continued, pc.last_continues, pc.chain, pc.pre, pc.post, pc.checked]
                             for pc in pieces], dtype=torch.int64, device=dev)
        m_all, end_all = _gather(m, group), _gather(last_end, group)
        info_all = [i.tolist() for i in _gather(info, group)]  # every rank's pieces' flags
        order = _chain_order(info_all)
        # The state entering each chain position's first segment where it is continued.
        carried = [None] * len(order)
        for c in range(1, len(order)):
            r, p = order[c - 1]
            crossing_prev, _, cont_prev = info_all[r][p][:3]
            if crossing_prev:  # through the previous piece (or past an empty one)
                if carried[c - 1] is not None:
                    carried[c] = torch.matmul(m_all[r][p], carried[c - 1]) + end_all[r][p]
            elif cont_prev:
                carried[c] = end_all[r][p]
        rerun = False
        for pc in pieces:
            if pc.count and pc.first_continued:  # rerun from the state it continues
                starts[pc.first] = carried[pc.chain]
                rerun = True
        if rerun:
            o, ends = _run_fwd(x, starts, plan, scale, flags)
        final = None
        if output_final_state:
            final = torch.zeros(plan.rows, HV, K, V, dtype=state_dtype, device=dev)
            for j, (row, _lo, _hi, _s, ends_here) in enumerate(segs):
                if ends_here or plan.local_rows:  # local rows: a segment going on gives its state there
                    final[row] = ends[j]
            if not plan.local_rows:
                final = torch.stack(_gather(final, group)).sum(0)  # each sequence ends on one rank
            for row in plan.empty_rows:  # no tokens: the final state is the initial one
                final[row] = h0[row].to(state_dtype) if h0 is not None else 0
        ctx.save_for_backward(q, k, v, g, beta, starts)
        # The backward composes with the same transitions and layout: kept, not gathered again.
        ctx.plan, ctx.m_all, ctx.info_all, ctx.order = plan, m_all, info_all, order
        ctx.scale, ctx.flags, ctx.group = scale, flags, group
        ctx.h0_dtype = h0.dtype if h0 is not None else None
        return o, final

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, starts = ctx.saved_tensors
        plan, group, order, info_all, m_all = ctx.plan, ctx.group, ctx.order, ctx.info_all, ctx.m_all
        x = (q, k, v, g, beta)
        segs, pieces = plan.segments, plan.pieces
        S, P = len(segs), len(pieces)
        dev, state_dtype = q.device, starts.dtype
        HV, K, V = v.shape[2], q.shape[-1], v.shape[-1]
        if do is None:
            do = torch.zeros(v.shape, dtype=v.dtype, device=dev)
        # The gradients reaching the segments' ends as far as this rank knows them.
        dends = torch.zeros(S, HV, K, V, dtype=state_dtype, device=dev)
        if dht is not None:
            for j, (row, _lo, _hi, _s, ends_here) in enumerate(segs):
                if ends_here or plan.local_rows:
                    dends[j] = dht[row].to(state_dtype)
        first_grad = torch.zeros(P, HV, K, V, dtype=state_dtype, device=dev)
        if any(pc.count and pc.first_continued for pc in pieces):
            dstarts = _run_bwd(x, starts, do, dends, plan, ctx.scale, ctx.flags)[5]
            for p, pc in enumerate(pieces):
                if pc.count and pc.first_continued:
                    first_grad[p] = dstarts[pc.first]
        fg_all = _gather(first_grad, group)
        # From the chain's end back: the gradient reaching each continued last segment's end.
        C = len(order)
        into_first = [None] * (C + 1)  # gradient reaching position c's continued first segment's start
        reaching_end = [None] * C
        for c in range(C - 1, -1, -1):
            r, p = order[c]
            crossing, first_cont, last_cont = info_all[r][p][:3]
            reaching_end[c] = into_first[c + 1] if last_cont or crossing else None
            if crossing:
                if reaching_end[c] is not None and first_cont:
                    into_first[c] = torch.matmul(m_all[r][p].transpose(-1, -2), reaching_end[c]) + fg_all[r][p]
                elif first_cont:
                    into_first[c] = fg_all[r][p]
                else:  # no tokens: passes through
                    into_first[c] = reaching_end[c]
            elif first_cont:
                into_first[c] = fg_all[r][p]
        for pc in pieces:
            if pc.count and pc.last_continues and reaching_end[pc.chain] is not None:
                dends[pc.first + pc.count - 1] += reaching_end[pc.chain]
        if S:
            dq, dk, dv, dg, dbeta, dstarts = _run_bwd(x, starts, do, dends, plan, ctx.scale, ctx.flags)
        else:
            dq, dk, dv, dg, dbeta = (torch.zeros_like(t) for t in (q, k, v, g, beta))
            dstarts = None
        dh0 = None
        if ctx.h0_dtype is not None:
            dh0 = torch.zeros(plan.rows, HV, K, V, dtype=state_dtype, device=dev)
            for j, (row, _lo, _hi, starts_here, _e) in enumerate(segs):
                if starts_here:
                    dh0[row] = dstarts[j]
            if not plan.local_rows:
                dh0 = torch.stack(_gather(dh0, group)).sum(0)
            for row in plan.empty_rows:
                if dht is not None:  # an empty sequence passes its gradient on
                    dh0[row] = dht[row].to(state_dtype)
            dh0 = dh0.to(ctx.h0_dtype)
        return dq, dk, dv, dg, dbeta, dh0, None, None, None, None, None


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
    (FLA's ``cp_context``, with each rank's local offsets, goes to
    ``flashqla.chunk_gated_delta_rule`` instead.)
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
    plan = _global_plan(cu, offsets[rank], offsets[rank + 1], rank)
    o, final = _ContextParallelGDN.apply(q, k, v, g, beta, initial_state, float(scale), flags, group, plan,
                                         bool(output_final_state))
    return (o, final) if output_final_state else (o, None)


# --------------------------------------------------------------------------------------
# FLA's cp_context (fla.ops.cp.FLACPContext, FLA 0.5.x and 0.6.x), read by attribute
# --------------------------------------------------------------------------------------

_LAYOUTS = ("contiguous", "zigzag")


def _context_seqlens(cp_context, cu_seqlens, cu_seqlens_cpu) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank's local boundaries from FLA's cp_context: (cu_seqlens as the context holds
    them, a host copy). Checks what one rank can check on its own (no collective). Reads
    ``cp_context.cu_seqlens`` on the host where the context has no ``cu_seqlens_cpu``, and a
    ``cu_seqlens`` / ``cu_seqlens_cpu`` argument given besides the context (which must
    hold the same boundaries)."""
    missing = [a for a in ("group", "cu_seqlens") if not hasattr(cp_context, a)]
    if missing:
        raise TypeError(f"flashqla: cp_context must be FLA's FLACPContext or have its attributes (group, cu_seqlens, "
                        f"cu_seqlens_cpu, is_first_rank, is_last_rank, pre_num_ranks, post_num_ranks, layout); got "
                        f"{type(cp_context).__name__} without {', '.join(missing)}")
    layout = getattr(cp_context, "layout", "contiguous")
    if layout not in _LAYOUTS:
        raise NotImplementedError(f"flashqla: cp_context layout {layout!r} is not supported (FLA's 'contiguous' and "
                                  f"'zigzag' are)")
    if cp_context.group is None:
        raise ValueError("flashqla: cp_context.group is None; context parallelism needs the ranks' process group "
                         "(FLA's build_cp_context(cu_seqlens, group) sets it). For independent sequences on each rank, "
                         "pass cu_seqlens and no cp_context")
    local = cp_context.cu_seqlens
    if local is None:
        raise ValueError("flashqla: cp_context.cu_seqlens is None; the context must hold this rank's local sequence "
                         "boundaries (FLA's build_cp_context sets them)")
    if not isinstance(local, torch.Tensor) or local.dim() != 1 or local.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"flashqla: cp_context.cu_seqlens must be a 1-d int32/int64 tensor, got "
                         f"{type(local).__name__ if not isinstance(local, torch.Tensor) else local.dtype}")
    host = getattr(cp_context, "cu_seqlens_cpu", None)
    if host is None:
        host = local.detach().cpu()  # a device-to-host copy where local is on a GPU
    host = host.to(torch.int64)
    for name, given in (("cu_seqlens", cu_seqlens), ("cu_seqlens_cpu", cu_seqlens_cpu)):
        if given is None or given is local or given is getattr(cp_context, "cu_seqlens_cpu", None):
            continue
        if not torch.equal(given.detach().cpu().to(torch.int64), host):
            raise ValueError(f"flashqla: {name} = {_short(given)} is passed with cp_context, whose local boundaries "
                             f"are {_short(host)}; with cp_context the context's are used (FLA overrides the "
                             f"argument), so pass {name}=None (the whole batch's offsets belong in build_cp_context)")
    return local, host


def _short(cu) -> str:
    values = cu.tolist()
    return str(values) if len(values) <= 12 else f"[{', '.join(map(str, values[:10]))}, ... ({len(values)} entries)]"


def _attr(cp_context, name):
    value = getattr(cp_context, name, None)
    if value is None:
        raise ValueError(f"flashqla: cp_context.{name} is missing (None); FLA's build_cp_context sets it")
    return value


def _context_plan(cp_context, cu: list, T: int, rank: int, world: int) -> _Plan:
    """This rank's plan from FLA's context: rows are the context's local sequences."""
    N = len(cu) - 1
    if getattr(cp_context, "layout", "contiguous") == "zigzag":
        part_len, front = int(_attr(cp_context, "part_len")), int(_attr(cp_context, "front_num_seqs"))
        first, last = _attr(cp_context, "is_first_by_part"), _attr(cp_context, "is_last_by_part")
        pre = getattr(cp_context, "pre_num_ranks_by_part", None) or (None, None)
        post = getattr(cp_context, "post_num_ranks_by_part", None) or (None, None)
        if T != 2 * part_len or not 0 < front < N or cu[front] != part_len:
            raise ValueError(f"flashqla: zigzag cp_context does not match the shard: {T} tokens (q.shape[1]) for two "
                             f"parts of part_len = {part_len}, front_num_seqs = {front}, cu_seqlens = {cu}")
        spans = [(0, front, rank, first[0], last[0], pre[0], post[0]),
                 (front, N, 2 * world - 1 - rank, first[1], last[1], pre[1], post[1])]
    else:
        spans = [(0, N, rank, _attr(cp_context, "is_first_rank"), _attr(cp_context, "is_last_rank"),
                  getattr(cp_context, "pre_num_ranks", None), getattr(cp_context, "post_num_ranks", None))]
    segs, pieces, empty = [], [], []
    for lo_seq, hi_seq, chain, is_first, is_last, pre_n, post_n in spans:
        first_cont, last_cont = not bool(is_first), not bool(is_last)
        if cu[hi_seq] <= cu[lo_seq]:
            raise ValueError(f"flashqla: cp_context gives chain position {chain} no tokens (cu_seqlens = {cu})")
        if (first_cont and cu[lo_seq + 1] == cu[lo_seq]) or (last_cont and cu[hi_seq] == cu[hi_seq - 1]):
            raise ValueError(f"flashqla: cp_context continues an empty sequence across ranks (cu_seqlens = {cu})")
        start = len(segs)
        for i in range(lo_seq, hi_seq):
            if cu[i + 1] == cu[i]:
                empty.append(i)
                continue
            segs.append((i, cu[i], cu[i + 1], not (i == lo_seq and first_cont), not (i == hi_seq - 1 and last_cont)))
        pieces.append(_Piece(chain, start, len(segs) - start, first_cont, last_cont,
                             -1 if pre_n is None else int(pre_n), -1 if post_n is None else int(post_n), True))
    return _Plan(segs, pieces, N, empty, True)


@torch.compiler.disable
def _chunk_with_cp_context(c, cp_context):
    """``flashqla.chunk_gated_delta_rule`` with FLA's cp_context, for a call ``_prepare``
    checked (``c``: its cu_seqlens are the context's local ones). Returns (o, final state or None)."""
    cu, T = c.cu_seqlens_cpu.tolist(), c.q.shape[1]
    if cu[0] != 0 or cu[-1] != T or any(a > b for a, b in zip(cu, cu[1:])):
        raise ValueError(f"flashqla: cp_context.cu_seqlens must rise from 0 to this rank's {T} tokens (q.shape[1]); "
                         f"got {cu}")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashqla: cp_context needs an initialised torch.distributed process group")
    group = cp_context.group
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    plan = _context_plan(cp_context, cu, T, rank, world)
    h0 = c.initial_state
    if h0 is not None and c.state_v_first:
        h0 = h0.transpose(-1, -2)
    flags = dict(use_qk_l2norm_in_kernel=c.use_qk_l2norm,
                 use_beta_sigmoid_in_kernel=c.beta_activation != ops.BETA_IDENTITY,
                 allow_neg_eigval=c.beta_activation == ops.BETA_SIGMOID_X2)
    o, final = _ContextParallelGDN.apply(c.q, c.k, c.v, c.g, c.beta, h0, c.scale, flags, group, plan,
                                         c.output_final_state)
    if final is not None and c.state_v_first:
        final = final.transpose(-1, -2)
    return o, final
