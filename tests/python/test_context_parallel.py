"""Context parallelism: one sequence split across 2 and 4 gloo processes
(flashqla.context_parallel), forward and backward, against the same sequence on one
process: on the CPU backend in fp64 (≤ 1e-10 relative), and on one GPU with its ranks
simulated by two processes sharing it (bf16, the GPU suite's bounds against fp64)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flashqla
from flashqla.context_parallel import chunk_gated_delta_rule_cp

from conftest import free_port, rel_error

H, HV, K, V = 2, 4, 16, 8


def make_case(T, seed, beta_sigmoid, K=K, V=V, N=1):
    gen = torch.Generator().manual_seed(seed)
    d = torch.float64
    # Weak decay and small beta, so a shard's transition stays far from zero (and far
    # from symmetric) over hundreds of tokens: every rank's result depends on the
    # states and gradients the others hand it.
    x = dict(q=torch.randn(1, T, H, K, generator=gen, dtype=d), k=torch.randn(1, T, H, K, generator=gen, dtype=d),
             v=torch.randn(1, T, HV, V, generator=gen, dtype=d),
             g=-0.002 * torch.rand(1, T, HV, generator=gen, dtype=d),
             beta=torch.randn(1, T, HV, generator=gen, dtype=d) - 3,
             h0=torch.randn(N, HV, K, V, generator=gen, dtype=d))
    if not beta_sigmoid:
        x["beta"] = x["beta"].sigmoid()
    x["do"] = torch.randn(1, T, HV, V, generator=gen, dtype=d)
    x["dht"] = torch.randn(N, HV, K, V, generator=gen, dtype=d)
    return x


def loss_and_grads(run, x):
    """(o, final state, gradients of q, k, v, g, beta, h0) of sum(o do) + sum(ht dht)."""
    leaves = {n: x[n].clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta", "h0")}
    o, ht = run(leaves)
    ((o * x["do"]).sum() + (ht * x["dht"]).sum()).backward()
    return o.detach(), ht.detach(), {n: t.grad for n, t in leaves.items()}


def single(x, beta_sigmoid, cu=None):
    def run(t):
        return flashqla.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], initial_state=t["h0"],
                                               output_final_state=True, use_qk_l2norm_in_kernel=True,
                                               use_beta_sigmoid_in_kernel=beta_sigmoid,
                                               cu_seqlens=None if cu is None else torch.tensor(cu))
    return loss_and_grads(run, x)


def worker(rank, world, port, bounds, seed, beta_sigmoid, out_dir, device="cpu", dims=(K, V), cu=None):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        x = make_case(bounds[-1], seed, beta_sigmoid, *dims, N=1 if cu is None else len(cu) - 1)
        lo, hi = bounds[rank], bounds[rank + 1]
        shard = {n: (t[:, lo:hi] if n in ("q", "k", "v", "g", "beta", "do") else t) for n, t in x.items()}
        if device == "cuda":  # bf16 tokens (the tensor-core kernels), fp32 gates and states
            shard = {n: t.to("cuda", torch.bfloat16 if n in ("q", "k", "v", "do") else torch.float32).contiguous()
                     for n, t in shard.items()}

        def run(t):
            return chunk_gated_delta_rule_cp(t["q"], t["k"], t["v"], t["g"], t["beta"], initial_state=t["h0"],
                                             output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True,
                                             use_beta_sigmoid_in_kernel=beta_sigmoid)
        o, ht, grads = loss_and_grads(run, shard)
        torch.save({n: t.cpu() for n, t in dict(o=o, ht=ht, **grads).items()}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()



@pytest.mark.parametrize("bounds,beta_sigmoid,cu", [
    ([0, 150, 300], False, None),              # two ranks, shards off the 64-token chunks
    ([0, 64, 65, 200, 333], True, None),        # four ranks, a one-token shard, beta logits
    ([0, 100, 100, 260, 300], False, None),     # an empty shard
    # packed batches: sequences within a shard, across two, across three (through a
    # 31-token and an empty shard), empty and one-token sequences, one ending on a
    # shard's edge
    ([0, 150, 300], False, [0, 40, 180, 181, 181, 300]),
    ([0, 60, 91, 91, 250, 333], True, [0, 10, 10, 95, 250, 251, 333]),
], ids=["2ranks", "4ranks_sigmoid", "4ranks_empty_shard", "2ranks_varlen", "5ranks_varlen"])
def test_split_sequence_equals_one_process(tmp_path, bounds, beta_sigmoid, cu):
    world = len(bounds) - 1
    mp.start_processes(worker, args=(world, free_port(), bounds, 7, beta_sigmoid, str(tmp_path), "cpu", (K, V), cu),
                       nprocs=world, start_method="spawn")
    x = make_case(bounds[-1], 7, beta_sigmoid, N=1 if cu is None else len(cu) - 1)
    o_ref, ht_ref, g_ref = single(x, beta_sigmoid, cu)
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    o = torch.cat([p["o"] for p in parts], dim=1)
    assert rel_error(o, o_ref) <= 1e-10
    for p in parts:  # every rank returns the sequence's final state and h0's gradient
        assert rel_error(p["ht"], ht_ref) <= 1e-10
        assert rel_error(p["h0"], g_ref["h0"]) <= 1e-10
    for n in ("q", "k", "v", "g", "beta"):
        got = torch.cat([p[n] for p in parts], dim=1)
        assert rel_error(got, g_ref[n]) <= 1e-10, n


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_split_sequence_on_one_gpu(tmp_path):
    """Two ranks simulated by two processes on the one GPU (gloo moves the states through
    the host): the CUDA forward and backward in the context-parallel path, bf16 inputs
    rounded the same way for the fp64 CPU reference, the GPU suite's bounds."""
    bounds, world = [0, 700, 1500], 2
    mp.start_processes(worker, args=(world, free_port(), bounds, 11, False, str(tmp_path), "cuda", (128, 128)),
                       nprocs=world, start_method="spawn")
    x = make_case(bounds[-1], 11, False, 128, 128)
    x = {n: (t.to(torch.bfloat16) if n in ("q", "k", "v", "do") else t.float()).double() for n, t in x.items()}
    o_ref, ht_ref, g_ref = single(x, False)
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    assert rel_error(torch.cat([p["o"] for p in parts], dim=1), o_ref) <= 0.008
    assert rel_error(parts[1]["ht"], ht_ref) <= 0.008
    assert rel_error(parts[0]["h0"], g_ref["h0"]) <= 0.008
    for n, tol in (("q", 0.008), ("k", 0.008), ("v", 0.008), ("g", 0.02), ("beta", 0.008)):
        got = torch.cat([p[n] for p in parts], dim=1)
        assert rel_error(got, g_ref[n]) <= tol, n


def test_needs_a_process_group():
    x = make_case(10, 0, False)
    with pytest.raises(RuntimeError, match="process group"):
        chunk_gated_delta_rule_cp(x["q"], x["k"], x["v"], x["g"], x["beta"])
