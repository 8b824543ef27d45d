"""Context-parallel benchmark: one sequence split across the ranks of a process group
(flashqla.chunk_gated_delta_rule_cp), inference (forward) and training (forward and
backward), against the whole sequence on one device and against FlashQLA's published
H200 x 8 figures.

Rows: the shapes of FlashQLA's published context-parallel table
(benchmarks/anchors/flashqla_h200x8_cp.csv, copied from benchmark_cp_results_H200x8.txt
in QwenLM/FlashQLA: five head configurations, one sequence of 32K to 1M tokens, 8 GPUs),
each run over every world size asked for (--worlds, default 2,4,8; sizes above the
machine's GPU count are left out) and on one device (world 1: the plain
flashqla.chunk_gated_delta_rule on the whole sequence; "oom" where it does not fit).

Method: rank r holds tokens [r T / W, (r + 1) T / W) (the published table's equal split),
bf16 q, k, v and dO (q, k l2-normalised outside, as the forward benchmark's inputs), fp32
g = logsigmoid(randn) / 16 and beta = sigmoid(randn), no initial state. Each figure is
the mean of --reps calls back to back after --warmup calls, timed with CUDA events on
every rank (the collectives inside keep the ranks in step), the slowest rank's mean
reported. inference: the forward under torch.no_grad(); training: the forward and the
gradients of every input through autograd. NCCL on GPUs (one process a GPU), gloo on
CPUs (--device cpu: a smoke test of the script with small --lengths, the CPU backend).

Writes cp_<card>.csv (cp_h200.csv, cp_h100.csv, cp_cpu.csv) in --out-dir: mode, model,
seqlens, h_qk, h_v, world, tok_per_card, flashqla_ms, single_ms (one device),
speedup_vs_single, published_qla_dual_ms (FlashQLA's figure for 8 ranks on the H200,
where the row is one of its rows and world is 8) and published_over_ours (> 1: ours is
faster); "oom" where the call does not fit the device (estimated before running, see
fits()). Run with `scripts/gpu.sh bench-cp`.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from results_table import card_stem

HERE = Path(__file__).resolve().parent
ANCHORS = HERE / "anchors" / "flashqla_h200x8_cp.csv"
K = V = 128
COLUMNS = ["mode", "model", "seqlens", "h_qk", "h_v", "world", "tok_per_card", "flashqla_ms", "single_ms",
           "speedup_vs_single", "published_qla_dual_ms", "published_over_ours"]


def read_anchors(path=ANCHORS):
    """The published rows: {(mode, model, T): row}."""
    rows = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            rows[(r["mode"], r["model"], int(r["seqlens"].split("x")[1]))] = r
    return rows


def shapes(anchors, models_regex, lengths):
    """(model, h_qk, h_v, T) in the published table's order, filtered by --models; --lengths
    replaces the published lengths (small sizes for the CPU)."""
    seen, out = set(), []
    for (_, model, T), r in anchors.items():
        if not re.search(models_regex, model):
            continue
        for t in (lengths or [T]):
            key = (model, t)
            if key not in seen:
                seen.add(key)
                out.append((model, int(r["h_qk"]), int(r["h_v"]), t))
    return out


def make_tokens(lo, hi, h_qk, h_v, device, seed):
    """Tokens [lo, hi) of one sequence from a generator seeded by the shard's start (the
    values differ from the one-device run's: these are timings, not a correctness check,
    which tests/python/test_context_parallel.py makes)."""
    gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + lo)
    n = hi - lo
    dt = torch.bfloat16 if device != "cpu" else torch.float64
    x = dict(q=F.normalize(torch.randn(1, n, h_qk, K, device=device, generator=gen), dim=-1).to(dt),
             k=F.normalize(torch.randn(1, n, h_qk, K, device=device, generator=gen), dim=-1).to(dt),
             v=torch.randn(1, n, h_v, V, device=device, generator=gen).to(dt),
             g=F.logsigmoid(torch.randn(1, n, h_v, device=device, generator=gen)) / 16,
             beta=torch.randn(1, n, h_v, device=device, generator=gen).sigmoid())
    if device == "cpu":
        x["g"], x["beta"] = x["g"].double(), x["beta"].double()
    do = torch.randn(1, n, h_v, V, device=device, generator=gen).to(dt)
    return x, do


def fits(tokens, h_qk, h_v, mode, device):
    """Whether a call on `tokens` tokens fits the device with room to spare: inputs, o and
    dO, the gradients and the backward's workspace (≈ 1.9 KB a token and value head) in
    training. Rows that do not fit are reported as oom without running: an out-of-memory
    error on one rank while the others wait in a collective would hang the group."""
    if device == "cpu":
        return True
    per_token = h_qk * K * 2 * 2 + h_v * V * 2 * 2 + h_v * 8  # q, k; v, o; g, beta
    if mode == "train":
        per_token += h_qk * K * 2 * 2 + h_v * V * 2 * 2 + h_v * 8 + h_v * 1944  # dq, dk; dO, dv; dg, dbeta; workspace
    return tokens * per_token < 0.8 * torch.cuda.get_device_properties(0).total_memory


def out_of_memory(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def mean_ms(fn, reps, warmup, device):
    for _ in range(warmup):
        fn()
    if device != "cpu":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) * 1e3 / reps


def step(run, x, do, mode):
    """The timed call: the forward (inference), or the forward and every input's gradient."""
    if mode == "infer":
        def call():
            with torch.no_grad():
                run(x)
        return call
    leaves = {n: t.detach().requires_grad_(True) for n, t in x.items()}

    def call():
        o = run(leaves)
        torch.autograd.grad(o, tuple(leaves.values()), do)
    return call


def cp_worker(rank, world, port, device, rows, modes, reps, warmup, out_path):
    import flashqla  # noqa: F401  (loads the library in the worker)
    from flashqla.context_parallel import chunk_gated_delta_rule_cp

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = f"cuda:{rank}"
    else:
        torch.set_num_threads(1)
        dev = "cpu"
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    results = []
    try:
        for model, h_qk, h_v, T in rows:
            lo, hi = rank * T // world, (rank + 1) * T // world
            x, do = make_tokens(lo, hi, h_qk, h_v, dev, seed=1)

            def run(t):
                o, _ = chunk_gated_delta_rule_cp(t["q"], t["k"], t["v"], t["g"], t["beta"])
                return o
            for mode in modes:
                ms = math.inf
                if fits(hi - lo, h_qk, h_v, mode, device):
                    try:
                        ms = mean_ms(step(run, x, do, mode), reps, warmup, device)
                    except RuntimeError as e:
                        if not out_of_memory(e):
                            raise
                        torch.cuda.empty_cache()
                t = torch.tensor([ms], dtype=torch.float64, device=dev if device == "cuda" else "cpu")
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank (inf: one ran out of memory)
                results.append((mode, model, T, world, float(t.item())))
            del x, do
            if device == "cuda":
                torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        torch.save(results, out_path)


def single_device(rows, modes, reps, warmup, device):
    """The plain call on the whole sequence (world 1)."""
    import flashqla

    dev = "cuda:0" if device == "cuda" else "cpu"
    results = []
    for model, h_qk, h_v, T in rows:
        for mode in modes:
            ms = math.inf
            if fits(T, h_qk, h_v, mode, device):
                try:
                    x, do = make_tokens(0, T, h_qk, h_v, dev, seed=1)

                    def run(t):
                        o, _ = flashqla.chunk_gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"])
                        return o
                    ms = mean_ms(step(run, x, do, mode), reps, warmup, device)
                    del x, do
                except RuntimeError as e:
                    if not out_of_memory(e):
                        raise
            if device == "cuda":
                torch.cuda.empty_cache()
            results.append((mode, model, T, 1, ms))
    return results


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def card_name(device):
    if device == "cpu":
        return "cpu"
    return card_stem(torch.cuda.get_device_name(0))


def table(results, rows, anchors):
    """Result rows for the CSV: each world's time next to the one-device time and the
    published 8-rank figure."""
    by = {(mode, model, T, world): ms for mode, model, T, world, ms in results}
    heads = {(model, T): (h_qk, h_v) for model, h_qk, h_v, T in rows}
    out = []
    for (mode, model, T, world), ms in by.items():
        h_qk, h_v = heads[(model, T)]
        single = by.get((mode, model, T, 1), math.nan)
        pub = anchors.get((mode, model, T))
        pub_ms = float(pub["qla_dual_ms"]) if pub is not None and world == 8 else math.nan
        out.append(dict(mode=mode, model=model, seqlens=f"1x{T}", h_qk=h_qk, h_v=h_v, world=world,
                        tok_per_card=T // world, flashqla_ms=fmt(ms), single_ms=fmt(single),
                        speedup_vs_single=fmt(single / ms if math.isfinite(ms) and math.isfinite(single) else math.nan),
                        published_qla_dual_ms=fmt(pub_ms),
                        published_over_ours=fmt(pub_ms / ms if math.isfinite(ms) else math.nan)))
    return out


def fmt(x):
    return "oom" if x == math.inf else "" if math.isnan(x) else f"{x:.4f}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="2,4,8", help="world sizes (ranks), comma-separated")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--models", default="", help="regular expression over the published model names")
    ap.add_argument("--lengths", default="", help="sequence lengths replacing the published ones (e.g. 512,1024)")
    ap.add_argument("--modes", default="infer,train")
    ap.add_argument("--no-single", action="store_true", help="skip the one-device run")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)

    anchors = read_anchors()
    lengths = [int(t) for t in args.lengths.split(",") if t]
    rows = shapes(anchors, args.models, lengths)
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - {"infer", "train"}:
        ap.error(f"--modes: infer and/or train, got {args.modes}")
    available = torch.cuda.device_count() if args.device == "cuda" else os.cpu_count()
    if args.device == "cuda" and available == 0:
        ap.error("no CUDA device (--device cpu runs the script on the CPU backend)")
    worlds = [w for w in (int(w) for w in args.worlds.split(",") if w) if w >= 2]
    skipped = [w for w in worlds if args.device == "cuda" and w > available]
    worlds = [w for w in worlds if w not in skipped]
    print(f"{len(rows)} shapes x {len(modes)} modes; worlds {worlds or '-'}"
          + (f" (left out, {available} GPUs: {skipped})" if skipped else "") + f"; device {args.device}", flush=True)

    results = []
    if not args.no_single:
        t0 = time.perf_counter()
        results += single_device(rows, modes, args.reps, args.warmup, args.device)
        print(f"one device: {time.perf_counter() - t0:.0f} s", flush=True)
    for world in worlds:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "results.pt")
            mp.start_processes(cp_worker, args=(world, free_port(), args.device, rows, modes, args.reps, args.warmup,
                                                out),
                               nprocs=world, start_method="spawn")
            results += torch.load(out)
        print(f"{world} ranks: {time.perf_counter() - t0:.0f} s", flush=True)

    lines = table(results, rows, anchors)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"cp_{card_name(args.device)}.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(lines)
    print("\n| mode | model | tokens | world | flashqla ms | one device ms | speedup | FlashQLA 8xH200 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in lines:
        print(f"| {r['mode']} | {r['model']} | {r['seqlens']} | {r['world']} | {r['flashqla_ms']} | {r['single_ms']} | "
              f"{r['speedup_vs_single']} | {r['published_qla_dual_ms']} |")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
