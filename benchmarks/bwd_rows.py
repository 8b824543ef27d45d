"""The published backward rows (benchmarks/anchors/flashqla_h200_bwd.csv) as the backward
benchmark runs them: each row's sequence lengths, split as FlashQLA's benchmark splits
them or equally. Importing this module changes nothing else (bench_bwd.py, which uses it,
sets FLA's environment on import)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import torch

ANCHORS = Path(__file__).resolve().parent / "anchors" / "flashqla_h200_bwd.csv"


def published_split(num_seqs: int, total: int, seed: int = 42) -> list[int]:
    """The sequence lengths FlashQLA's backward benchmark uses for num_seqs sequences of
    total tokens: cut points 1 + the first num_seqs − 1 values of a random permutation of
    0 .. total − 2 (torch.randperm on a CPU generator seeded with `seed`), sorted."""
    if num_seqs <= 1:
        return [total]
    gen = torch.Generator().manual_seed(seed)
    cuts = (torch.randperm(total - 1, dtype=torch.int32, generator=gen)[: num_seqs - 1].sort().values + 1).tolist()
    bounds = [0] + cuts + [total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def row_shape(r: dict, splits: str = "published") -> tuple[list[int], int, int]:
    """(sequence lengths, h_qk, h_v) of an anchors row: total_tokens split into num_seqs
    sequences (FlashQLA's split, or equal ones); checked against its label ("8k_4seq":
    8192 tokens, 4 sequences)."""
    n, total = int(r["num_seqs"]), int(r["total_tokens"])
    m = re.fullmatch(r"(\d+)k_(\d+)seq", r["seqlen"])
    if m is None or (int(m[1]) * 1024, int(m[2])) != (total, n):
        raise ValueError(f"anchors row {r['model']},{r['seqlen']}: {total} tokens in {n} sequences "
                         f"does not match its label")
    if splits == "equal":
        if total % n:
            raise ValueError(f"anchors row {r['model']},{r['seqlen']}: {total} tokens do not split into {n} equal "
                             f"sequences")
        lengths = [total // n] * n
    else:
        lengths = published_split(n, total)
    return lengths, int(r["h_qk"]), int(r["h_v"])


def read_anchors(rows_regex: str = "", path: Path = ANCHORS) -> list[dict]:
    """The published rows whose 'model,seqlens' (e.g. 'hk16_hv32,8k_1seq') the regex matches."""
    rows = list(csv.DictReader(path.open()))
    if rows_regex:
        rows = [r for r in rows if re.search(rows_regex, f"{r['model']},{r['seqlen']}")]
    for r in rows:
        row_shape(r)
    return rows
