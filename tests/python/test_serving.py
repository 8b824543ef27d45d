"""The serving entry, ``flashqla.chunk_gated_delta_rule_pooled``: a state pool read at
each sequence's slot and updated there in place, against the plain forward on the
states gathered from the pool (the gather / call / scatter it replaces). On the CPU
(fp64: the same computation, so equal results) and, where a CUDA device exists, on it.
"""

import pytest
import torch

import flashqla
from conftest import make_inputs, rel_error

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if torch.cuda.is_available() else [])


def _gather_call_scatter(x, pool, idx, state_v_first, **opts):
    """What engines do today: gather the slots' states (zeros for -1), call the plain
    forward, scatter the final states back into a copy of the pool."""
    safe = idx.clamp(min=0).long()
    h0 = torch.where((idx >= 0).view(-1, 1, 1, 1), pool[safe], torch.zeros_like(pool[safe]))
    o, ht = flashqla.chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=h0.to(torch.float32 if pool.dtype != torch.float64 else pool.dtype),
                                            output_final_state=True, cu_seqlens=x.get("cu_seqlens"),
                                            state_v_first=state_v_first, **opts)
    after = pool.clone()
    keep = idx >= 0
    after[idx[keep].long()] = ht[keep].to(pool.dtype)
    return o, after


def _case(device, dtype, pool_dtype, state_v_first, seed, K=16, V=12, slots=9):
    x = make_inputs(cu_seqlens=[0, 5, 70, 70, 131, 200], H=2, HV=4, K=K, V=V, dtype=dtype, device=device, h0=False,
                    seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    N, HV = 5, 4
    shape = (slots, HV, V, K) if state_v_first else (slots, HV, K, V)
    pool = torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=device, dtype=pool_dtype)
    perm = torch.randperm(slots, generator=gen)[:N]
    perm[torch.tensor([1, 3])] = -1  # two sequences start from zero and write nothing
    return x, pool, perm.to(device=device, dtype=torch.int32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_v_first", [False, True], ids=["k_first", "v_first"])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16], ids=["fp32_pool", "bf16_pool"])
def test_pool_updated_in_place_like_gather_call_scatter(device, state_v_first, pool_dtype):
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    K = V = 128 if device == "cuda" else 16
    x, pool, idx = _case(device, dtype, pool_dtype, state_v_first, seed=5, K=K, V=V)
    o_ref, pool_ref = _gather_call_scatter(x, pool, idx, state_v_first)
    before = pool.clone()
    out = torch.full_like(o_ref, float("nan"))
    o = flashqla.chunk_gated_delta_rule_pooled(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, idx,
                                               cu_seqlens=x["cu_seqlens"], output=out, state_v_first=state_v_first)
    assert o.data_ptr() == out.data_ptr()
    tol = 0.0 if device == "cpu" else 0.005
    assert rel_error(o, o_ref) <= tol
    assert rel_error(pool, pool_ref) <= tol
    untouched = torch.ones(pool.shape[0], dtype=torch.bool)
    untouched[idx[idx >= 0].long().cpu()] = False
    assert torch.equal(pool[untouched.to(device)], before[untouched.to(device)]), "rows no sequence took changed"


@pytest.mark.parametrize("device", DEVICES)
def test_no_write_back_leaves_the_pool(device):
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    K = V = 128 if device == "cuda" else 16
    x, pool, idx = _case(device, dtype, torch.float32, False, seed=6, K=K, V=V)
    before = pool.clone()
    o_ref, _ = _gather_call_scatter(x, pool, idx, False)
    o = flashqla.chunk_gated_delta_rule_pooled(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, idx,
                                               cu_seqlens=x["cu_seqlens"], write_final_state=False)
    assert torch.equal(pool, before)
    assert rel_error(o, o_ref) <= (0.0 if device == "cpu" else 0.005)


def test_bad_indices_and_tensors_are_refused():
    x, pool, idx = _case("cpu", torch.float64, torch.float32, False, seed=7)
    call = lambda **kw: flashqla.chunk_gated_delta_rule_pooled(  # noqa: E731
        x["q"], x["k"], x["v"], x["g"], x["beta"], kw.get("pool", pool), kw.get("idx", idx),
        cu_seqlens=x["cu_seqlens"], **{k: v for k, v in kw.items() if k not in ("pool", "idx")})
    dup = idx.clone()
    dup[0] = dup[2] = 4
    with pytest.raises(ValueError, match="both take slot 4"):
        call(idx=dup)
    past = idx.clone()
    past[0] = pool.shape[0]
    with pytest.raises(ValueError, match="below the pool's slot count"):
        call(idx=past)
    with pytest.raises(ValueError, match="state_indices must be an int32/int64 tensor of shape"):
        call(idx=idx[:-1])
    with pytest.raises(ValueError, match="state_pool must have shape"):
        call(pool=pool[:, :2])
    strided = pool.transpose(2, 3).contiguous().transpose(2, 3)  # pool's shape, last stride K
    with pytest.raises(ValueError, match="unit last stride"):
        call(pool=strided)
    with pytest.raises(ValueError, match="output must be"):
        call(output=torch.empty(3))
    q = x["q"].clone().requires_grad_(True)
    with pytest.raises(ValueError, match="inference only"):
        flashqla.chunk_gated_delta_rule_pooled(q, x["k"], x["v"], x["g"], x["beta"], pool, idx,
                                               cu_seqlens=x["cu_seqlens"])


def test_opcheck_gdn_fwd_pooled():
    x, pool, idx = _case("cpu", torch.float32, torch.float32, True, seed=8)
    o = torch.empty(x["v"].shape, dtype=torch.float32)
    ckpt = torch.empty((200 // 64, 4, 12, 16), dtype=torch.float32)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], 0.25, pool, idx, x["cu_seqlens"], None, o, True, True, False,
            0, ckpt, 1)
    torch.library.opcheck(torch.ops.flashqla.gdn_fwd_pooled.default, args)


@pytest.mark.parametrize("device", DEVICES)
def test_checkpoints_are_the_states_after_each_interval(device):
    """Checkpoints every chunk: row r of sequence n's rows is its state after 64 (j + 1)
    tokens, i.e. the final state of the plain forward over those tokens from the same
    slot's state."""
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    K = V = 128 if device == "cuda" else 16
    x, pool, idx = _case(device, dtype, torch.float32, False, seed=10, K=K, V=V)
    start = pool.clone()
    cu = x["cu_seqlens"].tolist()
    ckpt = torch.full((cu[-1] // 64, 4, K, V), float("nan"), device=device,
                      dtype=torch.float64 if device == "cpu" else torch.float32)
    flashqla.chunk_gated_delta_rule_pooled(x["q"], x["k"], x["v"], x["g"], x["beta"], pool, idx,
                                           cu_seqlens=x["cu_seqlens"], checkpoints=ckpt, checkpoint_chunks=1)
    row, tol = 0, (1e-10 if device == "cpu" else 0.005)
    for n in range(len(cu) - 1):
        h0 = start[idx[n].long()] if idx[n] >= 0 else torch.zeros_like(start[0])
        for j in range((cu[n + 1] - cu[n]) // 64):
            span = slice(cu[n], cu[n] + 64 * (j + 1))
            _, ht = flashqla.chunk_gated_delta_rule(x["q"][:, span], x["k"][:, span], x["v"][:, span],
                                                    x["g"][:, span], x["beta"][:, span], initial_state=h0[None],
                                                    output_final_state=True)
            assert rel_error(ckpt[row], ht[0]) <= tol, (n, j)
            row += 1
    assert torch.isnan(ckpt[row:]).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replay_with_new_indices():
    x, pool, idx = _case("cuda", torch.bfloat16, torch.float32, False, seed=9, K=128, V=128)
    start = pool.clone()
    out = torch.empty(x["v"].shape, dtype=torch.bfloat16, device="cuda")
    static_idx = idx.clone()
    run = lambda: flashqla.chunk_gated_delta_rule_pooled(  # noqa: E731
        x["q"], x["k"], x["v"], x["g"], x["beta"], pool, static_idx, cu_seqlens=x["cu_seqlens"], output=out)
    run()  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    for shift in (1, 2):
        new = torch.roll(idx, shift)
        pool.copy_(start)
        static_idx.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        o_ref, pool_ref = _gather_call_scatter(x, start, new, False)
        assert rel_error(out, o_ref) <= 0.005
        assert rel_error(pool, pool_ref) <= 0.005
