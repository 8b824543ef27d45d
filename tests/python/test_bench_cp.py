"""The context-parallel benchmark (benchmarks/bench_cp.py) runs end to end on the CPU
backend with gloo (a small length, two ranks), and its table puts FlashQLA's published
8-rank figure next to the 8-rank rows only."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_cp  # noqa: E402


def test_table_pairs_published_figures_with_eight_ranks():
    anchors = bench_cp.read_anchors()
    rows = [("h16/16", 16, 16, 262144)]
    results = [("infer", "h16/16", 262144, 1, 4.0), ("infer", "h16/16", 262144, 8, 2.0),
               ("infer", "h16/16", 262144, 2, 3.0)]
    by_world = {r["world"]: r for r in bench_cp.table(results, rows, anchors)}
    assert by_world[8]["published_qla_dual_ms"] == "1.2600"  # the published row 1x262144, h16/16
    assert math.isclose(float(by_world[8]["published_over_ours"]), 1.26 / 2.0, rel_tol=1e-6)
    assert by_world[2]["published_qla_dual_ms"] == ""
    assert by_world[2]["speedup_vs_single"] == "1.3333"
    assert by_world[8]["tok_per_card"] == 262144 // 8


def test_runs_on_the_cpu_with_two_ranks(tmp_path):
    cmd = [sys.executable, str(BENCH / "bench_cp.py"), "--device", "cpu", "--worlds", "2", "--lengths", "70",
           "--models", "^h16/16$", "--reps", "1", "--warmup", "0", "--out-dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = list(csv.DictReader(open(tmp_path / "cp_cpu.csv")))
    got = {(r["mode"], int(r["world"])) for r in rows}
    assert got == {("infer", 1), ("train", 1), ("infer", 2), ("train", 2)}
    for r in rows:
        assert math.isfinite(float(r["flashqla_ms"])) and float(r["flashqla_ms"]) > 0
        assert r["tok_per_card"] == str(70 // int(r["world"]))
