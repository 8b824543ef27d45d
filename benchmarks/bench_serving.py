"""Serving benchmark: the state-pool entry against the plain forward and against what
engines do without it (gather the slots' states, call, scatter the final states back).

Rows: 1024x8, 2048x4, 4096x8 and 8192x4 of every head configuration of FlashQLA's
published forward table (benchmarks/anchors/flashqla_h200_fwd.csv). Inputs as
bench_fwd.py (bf16 q, k, v; fp32 gates; int32 cu_seqlens with a host copy). The pool has
four slots a sequence, fp32, K-first or V-first (--layouts), and the sequences take
random distinct slots. Runs with `scripts/gpu.sh bench-serving [ROWS-REGEX]`. Three calls, each captured in a CUDA graph and replayed after an
L2 flush (the mean of --reps replays, CUDA events):

- plain:   flashqla.chunk_gated_delta_rule(..., initial_state=h0 [N], output_final_state=True)
- pooled:  flashqla.chunk_gated_delta_rule_pooled(..., pool, slots, output=o)
- gather:  h0 = pool[slots]; o, ht = flashqla.chunk_gated_delta_rule(...); pool[slots] = ht

Prints, per row and layout, the three times and pooled / plain (the target: at most
1.03) and pooled / gather; writes them to a CSV (--out, default
serving_<card>.csv in --out-dir, benchmarks/results) with the environment in a JSON sidecar.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from pathlib import Path

import torch

import flashqla
from bench_fwd import ANCHORS, L2Flush, card_name, environment, make_inputs, parse_seqlens, time_graph

HERE = Path(__file__).resolve().parent
SEQLENS = ("1024x8", "2048x4", "4096x8", "8192x4")


def rows(regex: str) -> list[dict]:
    with open(ANCHORS) as f:
        out = [r for r in csv.DictReader(f) if r["seqlens"] in SEQLENS]
    return [r for r in out if re.search(regex, f"{r['model']},{r['seqlens']}")] if regex else out


def measure(r: dict, v_first: bool, flush: L2Flush, reps: int) -> dict:
    seqlens = parse_seqlens(r["seqlens"])
    N, HV = len(seqlens), int(r["h_v"])
    x = make_inputs(seqlens, int(r["h_qk"]), HV)
    K, V = x["q"].shape[-1], x["v"].shape[-1]
    slots = 4 * N
    gen = torch.Generator(device="cuda").manual_seed(1)
    pool = torch.randn((slots, HV, V, K) if v_first else (slots, HV, K, V), device="cuda", generator=gen)
    idx = torch.randperm(slots, device="cuda", generator=gen)[:N].to(torch.int32)
    h0 = pool[idx.long()]
    o = torch.empty_like(x["v"])
    common = dict(scale=x["scale"], cu_seqlens=x["cu_seqlens"], cu_seqlens_cpu=x["cu_seqlens_cpu"],
                  state_v_first=v_first)
    tokens = (x["q"], x["k"], x["v"], x["g"], x["beta"])

    def plain():
        return flashqla.chunk_gated_delta_rule(*tokens, initial_state=h0, output_final_state=True, **common)

    def pooled():
        return flashqla.chunk_gated_delta_rule_pooled(*tokens, pool, idx, output=o, **common)

    def gather():
        _, ht = flashqla.chunk_gated_delta_rule(*tokens, initial_state=pool[idx.long()], output_final_state=True,
                                                **common)
        pool[idx.long()] = ht

    with torch.inference_mode():
        # The pooled call matches the gathered one before anything is timed.
        start = pool.clone()
        o_ref, ht_ref = flashqla.chunk_gated_delta_rule(*tokens, initial_state=start[idx.long()],
                                                        output_final_state=True, **common)
        pooled()
        err_o = ((o.float() - o_ref.float()).norm() / o_ref.float().norm()).item()
        err_s = ((pool[idx.long()] - ht_ref).norm() / ht_ref.norm()).item()
        ms = {name: time_graph(fn, flush, reps)[0] for name, fn in
              (("plain", plain), ("pooled", pooled), ("gather", gather))}
    return dict(model=r["model"], seqlens=r["seqlens"], h_qk=r["h_qk"], h_v=r["h_v"],
                layout="v_first" if v_first else "k_first", plain_ms=f"{ms['plain']:.4f}",
                pooled_ms=f"{ms['pooled']:.4f}", gather_ms=f"{ms['gather']:.4f}",
                pooled_over_plain=f"{ms['pooled'] / ms['plain']:.3f}",
                pooled_over_gather=f"{ms['pooled'] / ms['gather']:.3f}",
                rel_err_o=f"{err_o:.1e}", rel_err_state=f"{err_s:.1e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="the CSV (default: serving_<card>.csv in --out-dir)")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rows", default="", help="regular expression on 'model,seqlens'")
    ap.add_argument("--layouts", default="k_first,v_first")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_serving: needs a CUDA device", file=sys.stderr)
        return 2
    out = args.out or args.out_dir / f"serving_{card_name()}.csv"
    flush = L2Flush()
    measured = []
    todo = [(r, lay) for r in rows(args.rows) for lay in args.layouts.split(",")]
    for i, (r, lay) in enumerate(todo, 1):
        m = measure(r, lay == "v_first", flush, args.reps)
        measured.append(m)
        print(f"[{i}/{len(todo)}] {m['model']:<16} {m['seqlens']:<7} {m['layout']:<7} plain {m['plain_ms']} ms  "
              f"pooled {m['pooled_ms']} ms ({m['pooled_over_plain']}x)  gather+call+scatter {m['gather_ms']} ms "
              f"(pooled {m['pooled_over_gather']}x)  errors {m['rel_err_o']} / {m['rel_err_state']}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(measured[0]))
        w.writeheader()
        w.writerows(measured)
    out.with_suffix(".json").write_text(json.dumps(environment(), indent=2) + "\n")
    ratios = [float(m["pooled_over_plain"]) for m in measured]
    print(f"pooled / plain: geomean {statistics.geometric_mean(ratios):.3f}, worst {max(ratios):.3f} "
          f"({sum(x <= 1.03 for x in ratios)} of {len(ratios)} within 3 %); "
          f"pooled / gather+call+scatter: worst {max(float(m['pooled_over_gather']) for m in measured):.3f}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
