"""FLA's ``cp_context`` in ``flashqla.chunk_gated_delta_rule``: each rank passes its shard
with the context FLA builds for it (``fla.ops.cp.build_cp_context``, contiguous and
zigzag layouts) or an equal one built here by FLA's rules (``_interval_cp_meta``), on
gloo groups of 2 and 4 processes, the CPU backend in fp64. Against the same packed batch
on one process, at 1e-10 relative: o and the gradients of q, k, v, g, beta under FLA's
semantics (no initial or final state), and with flashqla's per-rank initial and final
states (rows of the rank's local sequences). Inputs as in test_context_parallel.py: weak
decay and small beta, so every rank's result depends on the states the others hand it.
Then the contexts refused: malformed on one rank, or not fitting the other ranks'."""

from __future__ import annotations

import bisect
import inspect
import os
import re

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashqla

from conftest import free_port, rel_error

H, HV, K, V = 2, 4, 16, 8
TOL = 1e-10


def make_case(T, seed, N):
    gen = torch.Generator().manual_seed(seed)
    d = torch.float64
    return dict(q=torch.randn(1, T, H, K, generator=gen, dtype=d), k=torch.randn(1, T, H, K, generator=gen, dtype=d),
                v=torch.randn(1, T, HV, V, generator=gen, dtype=d),
                g=-0.002 * torch.rand(1, T, HV, generator=gen, dtype=d),
                beta=torch.randn(1, T, HV, generator=gen, dtype=d) - 3,
                h0=torch.randn(N, HV, K, V, generator=gen, dtype=d),
                do=torch.randn(1, T, HV, V, generator=gen, dtype=d))


# --------------------------------------------------------------------------------------
# the layout: which tokens a rank holds, and FLA's context for them
# --------------------------------------------------------------------------------------


def chain_bounds(case, world):
    """Token bounds of the chain's intervals (FLA: W equal ones, or 2W for zigzag)."""
    T = case["cu"][-1]
    if case.get("bounds"):
        return case["bounds"]
    parts = 2 * world if case["layout"] == "zigzag" else world
    return [i * (T // parts) for i in range(parts + 1)]


def chain_positions(case, rank, world):
    return [rank, 2 * world - 1 - rank] if case["layout"] == "zigzag" else [rank]


def rank_spans(case, rank, world):
    """The global token intervals rank holds, in its buffer's order."""
    b = chain_bounds(case, world)
    return [(b[c], b[c + 1]) for c in chain_positions(case, rank, world)]


def local_rows(case, rank, world):
    """The rank's local sequences, in order: (global sequence, starts on this rank, global end here)."""
    cu, rows = case["cu"], []
    for a, b in rank_spans(case, rank, world):
        for n in range(len(cu) - 1):
            if max(cu[n], a) < min(cu[n + 1], b):
                rows.append((n, cu[n] >= a, min(cu[n + 1], b)))
    return rows


def interval_meta(cu, start, end, chain_pos, bounds):
    """FLA's ``_interval_cp_meta`` (fla/ops/cp/context.py) for chain intervals [bounds[c], bounds[c + 1])."""
    cu_t = torch.tensor(cu, dtype=torch.int64)
    s = int(torch.searchsorted(cu_t[1:], start, side="right"))
    e = int(torch.searchsorted(cu_t[:-1], end, side="left"))
    local = (cu_t[s:e + 1].clamp(min=start, max=end) - start).unique_consecutive().to(torch.int32)
    first_pos = bisect.bisect_right(bounds, cu[s]) - 1
    last_pos = bisect.bisect_right(bounds, cu[e] - 1) - 1
    return local, chain_pos - first_pos, chain_pos == first_pos, last_pos - chain_pos, last_pos == chain_pos


class HandContext:
    """FLA's FLACPContext attributes and nothing else (no FLA import)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def hand_context(case, rank, world, group, with_cpu_copy=True, with_layout=True):
    cu, b = case["cu"], chain_bounds(case, world)
    metas = [interval_meta(cu, b[c], b[c + 1], c, b) for c in chain_positions(case, rank, world)]
    if case["layout"] == "zigzag":
        part = b[1]
        local = torch.cat([metas[0][0], metas[1][0][1:] + part])
        return HandContext(group=group, cu_seqlens=local, cu_seqlens_cpu=local.clone() if with_cpu_copy else None,
                           layout="zigzag", part_len=part, front_num_seqs=len(metas[0][0]) - 1,
                           pre_num_ranks_by_part=(metas[0][1], metas[1][1]),
                           is_first_by_part=(metas[0][2], metas[1][2]),
                           post_num_ranks_by_part=(metas[0][3], metas[1][3]),
                           is_last_by_part=(metas[0][4], metas[1][4]))
    local, pre, is_first, post, is_last = metas[0]
    fields = dict(group=group, cu_seqlens=local, cu_seqlens_cpu=local.clone() if with_cpu_copy else None,
                  is_first_rank=is_first, pre_num_ranks=pre, is_last_rank=is_last, post_num_ranks=post)
    if with_layout:
        fields["layout"] = "contiguous"
    return HandContext(**fields)


def fla_context(case, group):
    from fla.ops.cp import build_cp_context

    cu = torch.tensor(case["cu"], dtype=torch.int64)
    if case["layout"] == "zigzag":
        return build_cp_context(cu, group, layout="zigzag")
    return build_cp_context(cu, group)


def local_extras(case, rank, rows, x):
    """Rank's initial states (the batch's h0 where its sequence starts here; noise where
    it continues, which must be ignored) and the gradient its final states get."""
    gen = torch.Generator().manual_seed(1000 * case["seed"] + rank)
    noise = torch.randn(len(rows), HV, K, V, generator=gen, dtype=torch.float64)
    dht = torch.randn(len(rows), HV, K, V, generator=gen, dtype=torch.float64)
    h0 = torch.stack([x["h0"][n] if starts else noise[i] for i, (n, starts, _e) in enumerate(rows)])
    return h0, dht


# --------------------------------------------------------------------------------------
# the ranks, and the same batch on one process
# --------------------------------------------------------------------------------------


def init(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def worker(rank, world, port, case, out_dir):
    init(rank, world, port)
    try:
        group = dist.group.WORLD
        if case["builder"] == "fla":
            ctx = fla_context(case, group)
        else:
            ctx = hand_context(case, rank, world, group, with_cpu_copy=case.get("cpu_copy", True),
                               with_layout=case.get("layout_attr", True))
        rows = local_rows(case, rank, world)
        x = make_case(case["cu"][-1], case["seed"], len(case["cu"]) - 1)
        spans = rank_spans(case, rank, world)
        shard = {n: torch.cat([x[n][:, a:b] for a, b in spans], dim=1) for n in ("q", "k", "v", "g", "beta", "do")}
        common = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=case["beta_sigmoid"], cp_context=ctx)
        out = {}
        # FLA's semantics under CP: no initial state, no final state.
        leaves = {n: shard[n].clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
        o, ht = flashqla.chunk_gated_delta_rule(*leaves.values(), **common)
        assert ht is None
        (o * shard["do"]).sum().backward()
        out["plain"] = dict(o=o.detach(), **{n: t.grad for n, t in leaves.items()})
        # flashqla's per-rank initial and final states.
        h0, dht = local_extras(case, rank, rows, x)
        vf = case.get("state_v_first", False)
        leaves = {n: shard[n].clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")}
        h0_leaf = (h0.transpose(-1, -2) if vf else h0).contiguous().requires_grad_(True)
        o, ht = flashqla.chunk_gated_delta_rule(*leaves.values(), initial_state=h0_leaf, output_final_state=True,
                                                state_v_first=vf, **common)
        if vf:
            ht = ht.transpose(-1, -2)
        ((o * shard["do"]).sum() + (ht * dht).sum()).backward()
        dh0 = h0_leaf.grad.transpose(-1, -2) if vf else h0_leaf.grad
        out["states"] = dict(o=o.detach(), ht=ht.detach(), h0=dh0, **{n: t.grad for n, t in leaves.items()})
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def reference(case, world, with_states):
    """The batch on one process: o, the gradients, and (with states) each rank's local
    rows' end states and the gradient of the batch's h0, for the loss the ranks sum."""
    cu = case["cu"]
    x = make_case(cu[-1], case["seed"], len(cu) - 1)
    t = {n: x[n].clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta", "h0")}
    flags = dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=case["beta_sigmoid"])
    o, ht = flashqla.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"],
                                            initial_state=t["h0"] if with_states else None,
                                            output_final_state=with_states, cu_seqlens=torch.tensor(cu), **flags)
    loss = (o * x["do"]).sum()
    states = {}
    if with_states:
        for r in range(world):
            rows = local_rows(case, r, world)
            _, dht = local_extras(case, r, rows, x)
            for i, (n, _starts, end) in enumerate(rows):
                if end == cu[n + 1]:
                    s = ht[n]
                else:  # the state where the sequence leaves the rank: its prefix's final state
                    a = cu[n]
                    _, s = flashqla.chunk_gated_delta_rule(t["q"][:, a:end], t["k"][:, a:end], t["v"][:, a:end],
                                                           t["g"][:, a:end], t["beta"][:, a:end],
                                                           initial_state=t["h0"][n:n + 1], output_final_state=True,
                                                           **flags)
                    s = s[0]
                states[r, i] = s
                loss = loss + (s * dht[i]).sum()
    loss.backward()
    grads = {n: t[n].grad for n in ("q", "k", "v", "g", "beta")}
    return o.detach(), grads, {key: s.detach() for key, s in states.items()}, t["h0"].grad



def needs_fla_builder(layout):
    cp = pytest.importorskip("fla.ops.cp")
    if layout == "zigzag" and "layout" not in inspect.signature(cp.build_cp_context).parameters:
        pytest.skip("this FLA's build_cp_context has no zigzag layout (FLA 0.6 has)")


CASES = {
    # one sequence across two ranks, FLA's own context
    "fla_2ranks_one_sequence": (2, dict(builder="fla", layout="contiguous", cu=[0, 300], seed=3, beta_sigmoid=False)),
    # four ranks, FLA's own context: sequences inside rank 0 (one empty, one ending on the
    # rank's edge), one starting on rank 1's edge, one across ranks 1-3 (rank 2 wholly
    # inside it), one inside rank 3
    "fla_4ranks_packed": (4, dict(builder="fla", layout="contiguous", cu=[0, 30, 30, 100, 150, 330, 400], seed=5,
                                  beta_sigmoid=True)),
    # zigzag, FLA's own context: rank 0 holds intervals 0 and 3, rank 1 intervals 1 and 2;
    # one sequence through intervals 0, 1, 2 (rank 1's two parts one after the other), a
    # one-token one, one across intervals 2 and 3
    "fla_2ranks_zigzag": (2, dict(builder="fla", layout="zigzag", cu=[0, 40, 180, 181, 300], seed=7,
                                  beta_sigmoid=False)),
    # a context built by FLA's rules, no FLA needed: uneven shards (one of one token), a
    # sequence across three ranks through it, ones inside a rank, one ending on an edge,
    # an empty one; no cu_seqlens_cpu (read from cu_seqlens) and no layout attribute (FLA 0.5)
    "hand_4ranks_uneven": (4, dict(builder="hand", layout="contiguous", bounds=[0, 60, 61, 250, 333],
                                   cu=[0, 10, 10, 95, 250, 251, 333], seed=9, beta_sigmoid=True, cpu_copy=False,
                                   layout_attr=False)),
    # zigzag built by FLA's rules, V-first states: intervals of 40 tokens, rank r holds r and 7 - r
    "hand_4ranks_zigzag_v_first": (4, dict(builder="hand", layout="zigzag", cu=[0, 25, 150, 151, 290, 320],
                                           seed=11, beta_sigmoid=False, state_v_first=True)),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.fla) if c["builder"] == "fla" else n
                                  for n, (_w, c) in CASES.items()])
def test_cp_context_equals_one_process(tmp_path, name):
    world, case = CASES[name]
    if case["builder"] == "fla":
        needs_fla_builder(case["layout"])
    case = dict(case, name=name)
    mp.start_processes(worker, args=(world, free_port(), case, str(tmp_path)), nprocs=world, start_method="spawn")
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]

    def buffer(t, r):
        return torch.cat([t[:, a:b] for a, b in rank_spans(case, r, world)], dim=1)

    for variant, with_states in (("plain", False), ("states", True)):
        o_ref, g_ref, states, dh0_ref = reference(case, world, with_states)
        for r, part in enumerate(parts):
            got = part[variant]
            assert rel_error(got["o"], buffer(o_ref, r)) <= TOL, (variant, r, "o")
            for n in ("q", "k", "v", "g", "beta"):
                assert rel_error(got[n], buffer(g_ref[n], r)) <= TOL, (variant, r, n)
            if not with_states:
                continue
            rows = local_rows(case, r, world)
            assert got["ht"].shape[0] == len(rows)
            for i, (n, starts, _end) in enumerate(rows):
                assert rel_error(got["ht"][i], states[r, i]) <= TOL, (r, i, "final state")
                if starts:
                    assert rel_error(got["h0"][i], dh0_ref[n]) <= TOL, (r, i, "dh0")
                else:  # continued from the previous rank: its row is not read
                    assert torch.count_nonzero(got["h0"][i]) == 0, (r, i, "dh0 of a continued row")


# --------------------------------------------------------------------------------------
# the contexts built here are FLA's
# --------------------------------------------------------------------------------------


@pytest.mark.fla
@pytest.mark.parametrize("layout,world,cu", [
    ("contiguous", 4, [0, 30, 30, 100, 150, 330, 400]),
    ("contiguous", 3, [0, 1, 299, 300]),
    ("zigzag", 2, [0, 40, 180, 181, 300]),
    ("zigzag", 4, [0, 25, 150, 151, 290, 320]),
])
def test_hand_context_is_flas(layout, world, cu):
    needs_fla_builder(layout)
    from fla.ops.cp.context import get_cp_cu_seqlens

    case = dict(layout=layout, cu=cu)
    for rank in range(world):
        kw = dict(layout="zigzag") if layout == "zigzag" else {}
        fla = get_cp_cu_seqlens(torch.tensor(cu, dtype=torch.int64), world_size=world, rank=rank, **kw)
        mine = hand_context(case, rank, world, None)
        names = (("part_len", "front_num_seqs", "pre_num_ranks_by_part", "post_num_ranks_by_part", "is_first_by_part",
                  "is_last_by_part") if layout == "zigzag" else
                 ("is_first_rank", "pre_num_ranks", "is_last_rank", "post_num_ranks"))
        assert fla.cu_seqlens_cpu.tolist() == mine.cu_seqlens.tolist(), rank
        for name in names:
            assert getattr(fla, name) == getattr(mine, name), (rank, name)


# --------------------------------------------------------------------------------------
# refusals
# --------------------------------------------------------------------------------------


def one_rank_context(**changes):
    local = torch.tensor([0, 40, 70], dtype=torch.int32)
    fields = dict(group=object(), cu_seqlens=local, cu_seqlens_cpu=local.clone(), is_first_rank=True, pre_num_ranks=0,
                  is_last_rank=False, post_num_ranks=1, layout="contiguous")
    fields.update(changes)
    return HandContext(**fields)


def shard_inputs(T=70, N=2):
    x = make_case(T, 0, N)
    return {n: x[n] for n in ("q", "k", "v", "g", "beta")}


@pytest.mark.parametrize("ctx,error,match", [
    (object(), TypeError, "cp_context must be FLA's FLACPContext"),
    (one_rank_context(group=None), ValueError, "cp_context.group is None"),
    (one_rank_context(cu_seqlens=None), ValueError, "cp_context.cu_seqlens is None"),
    (one_rank_context(layout="ring"), NotImplementedError, "layout 'ring'"),
    (one_rank_context(cu_seqlens=torch.tensor([0.0, 70.0])), ValueError, "1-d int32/int64"),
], ids=["not_a_context", "no_group", "no_cu_seqlens", "unknown_layout", "float_cu_seqlens"])
def test_malformed_context_is_refused(ctx, error, match):
    with pytest.raises(error, match=match):
        flashqla.chunk_gated_delta_rule(**shard_inputs(), cp_context=ctx)


def test_conflicting_cu_seqlens_is_refused():
    """FLA overrides cu_seqlens with the context's; flashqla refuses a different one (the
    whole batch's offsets, a likely mistake) rather than ignore it."""
    with pytest.raises(ValueError, match=r"cu_seqlens = \[0, 70, 140\] is passed with cp_context"):
        flashqla.chunk_gated_delta_rule(**shard_inputs(), cp_context=one_rank_context(),
                                        cu_seqlens=torch.tensor([0, 70, 140]))
    with pytest.raises(ValueError, match="cu_seqlens_cpu = .* is passed with cp_context"):
        flashqla.chunk_gated_delta_rule(**shard_inputs(), cp_context=one_rank_context(),
                                        cu_seqlens=torch.tensor([0, 40, 70], dtype=torch.int32),
                                        cu_seqlens_cpu=torch.tensor([0, 30, 70], dtype=torch.int32))


def test_shapes_are_the_local_ones():
    ctx = one_rank_context()
    x = shard_inputs()
    with pytest.raises(ValueError, match="number of initial states"):  # the batch's h0 rows, not the rank's
        flashqla.chunk_gated_delta_rule(**x, cp_context=ctx, initial_state=torch.zeros(3, HV, K, V))
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        flashqla.chunk_gated_delta_rule(**{n: t.expand(2, *t.shape[1:]) for n, t in x.items()}, cp_context=ctx)
    with pytest.raises(ValueError, match="rise from 0 to this rank's 69 tokens"):
        flashqla.chunk_gated_delta_rule(**{n: t[:, :69] for n, t in x.items()}, cp_context=ctx)


def test_needs_a_process_group():
    same = one_rank_context()
    with pytest.raises(RuntimeError, match="process group"):
        flashqla.chunk_gated_delta_rule(**shard_inputs(), cp_context=same, cu_seqlens=same.cu_seqlens)


def refusal_worker(rank, world, port, out_dir):
    """Each scenario gives every rank a context; where they do not fit together, every
    rank must raise (no rank left waiting in a collective)."""
    init(rank, world, port)
    try:
        group = dist.group.WORLD
        case = dict(layout="contiguous", cu=[0, 100])
        full = make_case(100, 0, 1)
        x = {n: full[n][:, 50 * rank:50 * (rank + 1)] for n in ("q", "k", "v", "g", "beta")}
        good = hand_context(case, rank, world, group)
        scenarios = {
            # rank 1 says its sequence starts there; rank 0 says it goes on
            "first_flag": dict(is_first_rank=True, pre_num_ranks=0) if rank == 1 else {},
            "pre_num_ranks": dict(pre_num_ranks=2) if rank == 1 else {},
            "last_rank_goes_on": dict(is_last_rank=False, post_num_ranks=1) if rank == 1 else {},
            "no_is_first_rank": dict(is_first_rank=None),
            "zigzag_part_len": dict(layout="zigzag", part_len=20, front_num_seqs=1, is_first_by_part=(True, True),
                                    is_last_by_part=(True, True)),
            "no_tokens": dict(cu_seqlens=torch.tensor([0, 0], dtype=torch.int32), cu_seqlens_cpu=None),
        }
        out = {}
        for name, change in scenarios.items():
            ctx = HandContext(**{**good.__dict__, **change})
            if name == "no_tokens":
                args = {n: t[:, :0] for n, t in x.items()}
            else:
                args = x
            try:
                flashqla.chunk_gated_delta_rule(**args, cp_context=ctx)
                out[name] = None
            except Exception as e:  # noqa: BLE001 - recorded for the test to judge
                out[name] = (type(e).__name__, str(e))
        # the group still works: a good call after the refused ones
        o, _ = flashqla.chunk_gated_delta_rule(**x, cp_context=good)
        out["after"] = o
        torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_contexts_that_do_not_fit_are_refused_on_every_rank(tmp_path):
    world = 2
    mp.start_processes(refusal_worker, args=(world, free_port(), str(tmp_path)), nprocs=world, start_method="spawn")
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    expected = {"first_flag": "do not fit together: rank 1 .* says its first sequence does not continue from rank 0",
                "pre_num_ranks": "rank 1 .* has pre_num_ranks = 2, but the ranks' first/last flags give 1",
                "last_rank_goes_on": "holds the batch's last tokens but says its last sequence goes on",
                "no_is_first_rank": r"cp_context.is_first_rank is missing",
                "zigzag_part_len": "zigzag cp_context does not match the shard",
                "no_tokens": "gives chain position [01] no tokens"}
    for name, pattern in expected.items():
        for r, part in enumerate(parts):
            assert part[name] is not None, (name, r, "accepted")
            kind, message = part[name]
            assert kind == "ValueError" and re.search(pattern, message), (name, r, kind, message)
    x = make_case(100, 0, 1)
    o_ref, _ = flashqla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])
    assert rel_error(torch.cat([p["after"] for p in parts], dim=1), o_ref) <= TOL
