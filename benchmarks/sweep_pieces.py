"""Sequence-piece sweep: flashqla's forward on few-chain shapes with whole
sequences, with the default plan (with and without the output pass as a programmatic dependent
launch), and with each forced piece length, timed with
bench_fwd.py's method (CUDA-graph replay after an L2 flush, mean). The data for
the cost model in src/cuda/sequence_pieces.h.

    python benchmarks/sweep_pieces.py [--out sweep.csv]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_fwd  # noqa: E402
import flashqla  # noqa: E402
import torch  # noqa: E402

# (seqlens, h_qk, h_v): single sequences and skewed pairs at 8 to 64 value heads.
SHAPES = [
    ("1x32768", 2, 8), ("1x8192", 2, 8), ("1x2048", 2, 8), ("8192x4", 2, 8),
    ("1x8192", 4, 16), ("1x2048", 4, 16), ("16384+16384", 4, 16), ("4096+4096", 4, 16),
    ("1x8192", 8, 24), ("28672+4096", 8, 24), ("1024+7168", 8, 24),
    ("1x32768", 8, 32), ("1x8192", 8, 32), ("1x2048", 8, 32), ("1024+7168", 8, 32),
    ("1x8192", 16, 48), ("1x8192", 16, 64),
]
PIECE_CHUNKS = [4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192]


def timed(x, flush, reps, sequence_parallel, piece_chunks, programmatic="1"):
    os.environ["FLASHQLA_SEQUENCE_PARALLEL"] = sequence_parallel
    os.environ["FLASHQLA_PIECE_CHUNKS"] = piece_chunks
    os.environ["FLASHQLA_PROGRAMMATIC_LAUNCH"] = programmatic
    ms, _ = bench_fwd.time_graph(lambda: flashqla.chunk_gated_delta_rule(**x), flush, reps)
    return ms


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("sweep_pieces.csv"))
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    flush = bench_fwd.L2Flush()
    rows = []
    with torch.no_grad():
        for spec, h_qk, h_v in SHAPES:
            seqlens = bench_fwd.parse_seqlens(spec)
            x = bench_fwd.make_inputs(seqlens, h_qk, h_v)
            longest = max(math.ceil(s / 64) for s in seqlens)
            settings = [("whole", "0", "", "1"), ("default", "", "", "1"), ("default-plain-launch", "", "", "0")]
            settings += [(str(c), "1", str(c), "1") for c in PIECE_CHUNKS if c < longest]
            line = f"{spec:>12} HV={h_v:<3}"
            for name, sp, pc, programmatic in settings:
                ms = timed(x, flush, args.reps, sp, pc, programmatic)
                rows.append({"seqlens": spec, "h_qk": h_qk, "h_v": h_v, "setting": name, "ms": f"{ms:.4f}"})
                line += f" {name}:{ms:.3f}"
            print(line, flush=True)
            del x
    os.environ.pop("FLASHQLA_SEQUENCE_PARALLEL", None)
    os.environ.pop("FLASHQLA_PIECE_CHUNKS", None)
    os.environ.pop("FLASHQLA_PROGRAMMATIC_LAUNCH", None)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
