"""Where the fixed cost of a forward call goes: time against sequence length.

For one wave of chains (4 sequences x 32 value heads: 128 chains on the H200's
132 SMs), two waves (8 x 32) and one chain, times flashqla's forward with
bench_fwd.py's method (CUDA-graph replay after an L2 flush, CUDA events, mean)
over sequence lengths, and the fused kernel's own duration (CUPTI,
torch.profiler) for the same replays. A straight line through (chunks, time)
gives the cost a chunk (slope) and a call's fixed cost (intercept); the
difference between event and kernel time is the launch. Sequence pieces are
off (whole chains).

    python benchmarks/tools/fixed_cost.py [--reps 20] [--states none,h0,ht,both]
        [--lengths 512,1024,2048,4096,8192] [--shapes wave,two,chain]

--states picks which of the initial state (h0) and the final state (ht) the calls
have: their loads and stores are part of a CTA's fixed cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("FLASHQLA_SEQUENCE_PARALLEL", "0")  # whole chains: the line is a chain's

import torch  # noqa: E402

import flashqla  # noqa: E402
from bench_fwd import L2Flush, captured, make_inputs, mean_event_ms  # noqa: E402


def kernel_us(run, flush, reps):
    """Mean duration (µs) of the fused kernel over `reps` replays, from CUPTI."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush()
            run()
        torch.cuda.synchronize()
    times = [e.device_time for e in prof.events() if "gdn_fwd" in e.name]
    return sum(times) / max(1, reps), len(times) / max(1, reps)


def measure(label, n_seq, h_qk, h_v, states, lengths, flush, reps):
    print(f"--- {label}, states: {states}")
    print(f"{'T':>6} {'chunks':>6} {'event us':>9} {'kernel us':>9} {'launches':>8}")
    ev, kn = [], []
    for T in lengths:
        x = make_inputs([T] * n_seq, h_qk, h_v)
        if states in ("none", "ht"):
            x["initial_state"] = None
        x["output_final_state"] = states in ("ht", "both")
        run, _ = captured(lambda: flashqla.chunk_gated_delta_rule(**x))
        e = 1000 * mean_event_ms(run, flush, reps)
        k, launches = kernel_us(run, flush, reps)
        ev.append((T // 64, e))
        kn.append((T // 64, k))
        print(f"{T:>6} {T // 64:>6} {e:>9.1f} {k:>9.1f} {launches:>8.1f}")
    for name, pts in (("event", ev), ("kernel", kn)):
        s, b = statistics.linear_regression([x for x, _ in pts], [y for _, y in pts])
        print(f"{name}: {s:.3f} us a chunk, fixed {b:.1f} us")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--states", default="both", help="comma-separated: none, h0, ht, both")
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192")
    ap.add_argument("--shapes", default="wave,two,chain")
    args = ap.parse_args()
    flush = L2Flush()
    lengths = [int(t) for t in args.lengths.split(",")]
    shapes = {"wave": ("one wave: 4 sequences x 32 heads", 4, 16, 32),
              "two": ("two waves: 8 sequences x 32 heads", 8, 16, 32), "chain": ("one chain", 1, 1, 1)}
    for states in args.states.split(","):
        for name in args.shapes.split(","):
            measure(*shapes[name], states, lengths, flush, args.reps)


if __name__ == "__main__":
    main()
