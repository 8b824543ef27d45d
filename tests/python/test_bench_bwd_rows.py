"""The backward benchmark's rows (benchmarks/bwd_rows.py, used by bench_bwd.py): every published row's label
matches its token and sequence counts, and the multi-sequence rows take FlashQLA's
split (cut points from torch.randperm on a CPU generator seeded with 42), so their
ratios over FLA compare with the published ones."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bwd_rows  # noqa: E402  (bench_bwd itself sets FLA_FLASHQLA=0 on import: not in this process)


def test_every_published_row_has_a_shape():
    rows = bwd_rows.read_anchors("")
    assert len(rows) == 32
    for r in rows:
        for splits in ("published", "equal"):
            lengths, h_qk, h_v = bwd_rows.row_shape(r, splits)
            assert len(lengths) == int(r["num_seqs"]) and sum(lengths) == int(r["total_tokens"])
            assert min(lengths) >= 1 and (h_qk, h_v) == (int(r["h_qk"]), int(r["h_v"]))


def test_published_split_is_flashqla_s():
    # The rule of FlashQLA's benchmark (generate_rand_seqlens) on torch 2.11's CPU
    # generator: 8k in two sequences is 7053 + 1139 tokens.
    assert bwd_rows.published_split(2, 8192) == [7053, 1139]
    assert bwd_rows.published_split(1, 8192) == [8192]
    eight = bwd_rows.published_split(8, 32768)
    assert sum(eight) == 32768 and max(eight) == 9932 and eight == bwd_rows.published_split(8, 32768)
    assert bwd_rows.published_split(4, 8192) == [5809, 1244, 406, 733]
