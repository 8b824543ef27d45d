"""Forward benchmark: flashqla against FLA's Triton kernels, in the same run, on the
rows of FlashQLA's published H200 table (benchmarks/anchors/flashqla_h200_fwd.csv,
copied from the published figures).

Method (FlashQLA's, so figures compare with the published columns): inputs
q, k = l2norm(randn) bf16, v = randn bf16, g = logsigmoid(randn)/16 fp32 with a random
25% of value heads at g = 0, beta = sigmoid(randn) fp32, h0 = randn fp32, scale =
K^-1/2, output_final_state=True, all sequences packed with int32 cu_seqlens (B = 1).
Each implementation is captured in a CUDA graph; every timed replay follows an L2
flush (a 256 MiB write) and is timed with CUDA events; the figure is the mean.
FLA runs with flashqla's FLA backend switched off (FLA_FLASHQLA=0), so FLA means
FLA's own kernels.

Model of the work (per 64-token chunk and value head, K = V = 128): about 9.4 MFLOP
of GEMMs; bytes are q, k (H heads), v, o (HV heads), g, beta and the states.

With --fused-gate both take the gate the way FLA's GatedDeltaNet layer passes it: a
raw bf16 gate with A_log and dt_bias (use_gate_in_kernel=True, g := -exp(A_log) *
softplus(g + dt_bias)) and bf16 beta logits (use_beta_sigmoid_in_kernel=True); FLA
fuses the gate into its kernels, flashqla computes it in fp32 before its kernel.

Writes a CSV (direction,model,seqlens,h_qk,h_v,flashqla_ms,fla_ms,...) and a JSON
sidecar with the environment; prints a table with the speedups over FLA and the
published best speedup (fla_ms / min(flash_qla_ms, flashinfer_ms)) per row. The run's
rows replace the file's forward rows; the backward's (bench_bwd.py) are kept
(results_table.py).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("FLA_FLASHQLA", "0")  # FLA's own kernels for the baseline

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import flashqla  # noqa: E402
from results_table import ResultsTable, card_stem  # noqa: E402

HERE = Path(__file__).resolve().parent
ANCHORS = HERE / "anchors" / "flashqla_h200_fwd.csv"
K = V = 128
FLOP_PER_CHUNK_HEAD = 9.4e6


def parse_seqlens(spec: str) -> list[int]:
    """'1x32768' -> [32768]; '28672+4096' -> [28672, 4096]; '8192x4' -> [8192] * 4."""
    if "+" in spec:
        return [int(x) for x in spec.split("+")]
    a, b = spec.split("x")
    return [int(b)] if a == "1" else [int(a)] * int(b)


def make_inputs(seqlens, h_qk, h_v, seed=0, fused_gate=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(seqlens)
    dev = "cuda"
    q = F.normalize(torch.randn(1, T, h_qk, K, device=dev, generator=gen), dim=-1).bfloat16()
    k = F.normalize(torch.randn(1, T, h_qk, K, device=dev, generator=gen), dim=-1).bfloat16()
    v = torch.randn(1, T, h_v, V, device=dev, generator=gen).bfloat16()
    g = F.logsigmoid(torch.randn(1, T, h_v, device=dev, generator=gen)) / 16
    zero_heads = torch.rand(h_v, device=dev, generator=gen) < 0.25
    g[:, :, zero_heads] = 0
    beta = torch.randn(1, T, h_v, device=dev, generator=gen).sigmoid()
    h0 = torch.randn(len(seqlens), h_v, K, V, device=dev, generator=gen)
    cu_cpu = torch.tensor([0] + list(torch.tensor(seqlens).cumsum(0).tolist()), dtype=torch.int32)
    x = dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=h0, cu_seqlens=cu_cpu.cuda(), cu_seqlens_cpu=cu_cpu,
             scale=K ** -0.5, output_final_state=True)
    if fused_gate:  # as FLA's GatedDeltaNet layer: a_proj / b_proj outputs, its A_log and dt_bias init
        dt = torch.exp(torch.rand(h_v, device=dev, generator=gen) * (math.log(0.1) - math.log(0.001))
                       + math.log(0.001))
        x.update(g=torch.randn(1, T, h_v, device=dev, generator=gen).bfloat16(),
                 beta=torch.randn(1, T, h_v, device=dev, generator=gen).bfloat16(),
                 A_log=torch.empty(h_v, device=dev).uniform_(1, 16, generator=gen).log(),
                 dt_bias=dt + torch.log(-torch.expm1(-dt)), use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True)
    return x


class L2Flush:
    def __init__(self, nbytes=256 << 20):
        self.buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

    def __call__(self):
        self.buf.zero_()


def time_graph(fn, flush, reps, warmup=3):
    """Mean ms of graph replays of fn, each after an L2 flush. Falls back to eager
    launches (same flush and events) if fn cannot be captured; returns (ms, method)."""
    run, method = captured(fn, warmup)
    return mean_event_ms(run, flush, reps), method


def captured(fn, warmup=3):
    """fn warmed up and captured in a CUDA graph: (graph.replay, "graph"), or
    (fn, "eager") if fn cannot be captured."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    method = "graph"
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
        run()
    except Exception:  # noqa: BLE001 - an implementation that cannot be captured is timed eagerly
        method = "eager"
        run = fn
    torch.cuda.synchronize()
    return run, method


def mean_event_ms(run, flush, reps):
    """Mean ms of `reps` calls of run, each after an L2 flush, between CUDA events."""
    times = []
    for _ in range(reps):
        flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.mean(times)


def fla_forward():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule


def environment():
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "flashqla": flashqla.__version__}
    try:
        env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip()
    except OSError:
        env["driver"] = "unknown"
    for name in ("triton", "fla"):
        try:
            env[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            env[name] = "not installed"
    return env


def card_name():
    """The results' file stem for this GPU: h200, h100, or gpu for any other card."""
    return card_stem(torch.cuda.get_device_name())


def chunk_latency_us(flush, reps):
    """Serial latency of one (sequence, head) chain: one sequence of 8192 tokens, one head.

    Sequence pieces are turned off for it: cut into pieces, the sequence would run
    on many SMs at once and the time per chunk would no longer be a chain's latency.
    """
    x = make_inputs([8192], 1, 1)
    saved = os.environ.get("FLASHQLA_SEQUENCE_PARALLEL")
    os.environ["FLASHQLA_SEQUENCE_PARALLEL"] = "0"
    try:
        ms, _ = time_graph(lambda: flashqla.chunk_gated_delta_rule(**x), flush, reps)
    finally:
        if saved is None:
            del os.environ["FLASHQLA_SEQUENCE_PARALLEL"]
        else:
            os.environ["FLASHQLA_SEQUENCE_PARALLEL"] = saved
    return ms * 1000 / (8192 / 64)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None,
                    help="the CSV to write (its sidecar: the same name, .json); default: in --out-dir, named by "
                         "the card: h200.csv on an H200, h100.csv on an H100, gpu.csv on any other")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results",
                    help="where the card-named CSV goes when --out is not given")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rows", default="", help="regular expression: keep rows whose 'model,seqlens' it matches "
                                                "(e.g. 'TP8,1x' or '^397B/122B TP1,')")
    ap.add_argument("--min-pairs", type=int, default=0,
                    help="keep rows with at least this many (sequence, value-head) pairs (128: the rows of the "
                         "speed acceptance)")
    ap.add_argument("--no-fla", action="store_true", help="time flashqla only")
    ap.add_argument("--no-host-lengths", action="store_true",
                    help="leave cu_seqlens_cpu out (the sequence-piece plan then takes the lengths as equal)")
    ap.add_argument("--fused-gate", action="store_true",
                    help="the gate as FLA's GatedDeltaNet passes it (raw gate, A_log, dt_bias, beta logits); "
                         "default output <card>_fused_gate.csv")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = args.out_dir / f"{card_name()}{'_fused_gate' if args.fused_gate else ''}.csv"

    rows = list(csv.DictReader(ANCHORS.open()))
    if args.rows:
        rows = [r for r in rows if re.search(args.rows, f"{r['model']},{r['seqlens']}")]
    if args.min_pairs:
        rows = [r for r in rows if len(parse_seqlens(r["seqlens"])) * int(r["h_v"]) >= args.min_pairs]
    fla = None if args.no_fla else fla_forward()
    flush = L2Flush()
    results = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    env = environment()
    env["fla_note"] = "FLA timed with its own kernels (FLA_FLASHQLA=0)"
    env["host_lengths"] = not args.no_host_lengths  # cu_seqlens_cpu passed
    env["fused_gate"] = args.fused_gate
    env["rows_planned"], env["rows_measured"] = len(rows), 0

    # The card's file may also hold the backward's rows (bench_bwd.py): they are kept, and a
    # new file elsewhere starts from the committed one of its name (results_table.py).
    table = ResultsTable(args.out, "fwd", keep_unmeasured=False, base=HERE / "results" / args.out.name)

    def write_sidecar():  # after every row too, so a run cut short says so
        table.write_sidecar(env)

    write_sidecar()
    for r in rows:
        seqlens, h_qk, h_v = parse_seqlens(r["seqlens"]), int(r["h_qk"]), int(r["h_v"])
        x = make_inputs(seqlens, h_qk, h_v, fused_gate=args.fused_gate)
        if args.no_host_lengths:
            del x["cu_seqlens_cpu"]
        with torch.no_grad():
            ours_ms, ours_method = time_graph(lambda: flashqla.chunk_gated_delta_rule(**x), flush, args.reps)
            o, ht = flashqla.chunk_gated_delta_rule(**x)
            fla_ms, fla_method, diff = math.nan, "-", math.nan
            if fla is not None:
                fla_ms, fla_method = time_graph(lambda: fla(**x), flush, args.reps)
                fo, _ = fla(**x)
                diff = ((o.float() - fo.float()).norm() / fo.float().norm()).item()
        published = float(r["fla_ms"]) / min(float(r["flash_qla_ms"]), float(r["flashinfer_ms"]))
        chunks = sum(math.ceil(s / 64) for s in seqlens) * h_v
        results.append({
            "direction": "fwd", "model": r["model"], "seqlens": r["seqlens"], "h_qk": h_qk, "h_v": h_v,
            "flashqla_ms": f"{ours_ms:.4f}", "fla_ms": f"{fla_ms:.4f}", "speedup_vs_fla": f"{fla_ms / ours_ms:.3f}",
            "published_best_speedup": f"{published:.3f}", "pairs": len(seqlens) * h_v,
            "flashqla_tflops": f"{chunks * FLOP_PER_CHUNK_HEAD / ours_ms / 1e9:.1f}",
            "rel_diff_vs_fla": f"{diff:.2e}", "timing": f"{ours_method}/{fla_method}",
        })
        table.add(results[-1])  # rows are written as they come, so an interrupted run keeps what it measured
        env["rows_measured"] = len(results)
        write_sidecar()
        print(f"{r['model']:>16} {r['seqlens']:>13} H={h_qk:<2} HV={h_v:<3} flashqla {ours_ms:8.3f} ms  "
              f"FLA {fla_ms:8.3f} ms  x{fla_ms / ours_ms:5.2f} (published best x{published:4.2f})  "
              f"diff {diff:.1e}", flush=True)
        del x, o, ht

    env["chunk_latency_us"] = round(chunk_latency_us(flush, args.reps), 3)
    write_sidecar()

    big = [r for r in results if r["pairs"] >= 128 and r["fla_ms"] != "nan"]
    if big:
        gm = math.exp(statistics.mean(math.log(float(r["speedup_vs_fla"])) for r in big))
        gp = math.exp(statistics.mean(math.log(float(r["published_best_speedup"])) for r in big))
        print(f"rows with >= 128 (sequence, head) pairs: {len(big)}; geomean speedup over FLA x{gm:.3f} "
              f"(published best x{gp:.3f})")
    print(f"per-chunk serial latency (one sequence, one head, 64 tokens): {env['chunk_latency_us']} us")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    sys.exit(main())
