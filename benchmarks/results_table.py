"""A card's results file (benchmarks/results/<card>.csv and its .json sidecar), shared
by the benchmarks of both directions: bench_fwd.py writes the rows with direction=fwd,
bench_bwd.py those with direction=bwd, and neither drops the other's.

The CSV holds one row per (direction, model, seqlens). Its columns are the union of
what the benchmarks write, in the order first written (a column that only one
direction fills stays empty in the other's rows). Rows are grouped by direction (fwd
first); a re-measured row replaces the old one in place, a new one comes last in its
group. Each write replaces the whole file at once (a temporary file, then a rename),
after every row, so that a run cut short keeps what it measured and never leaves a
half-written file.

The sidecar holds the environment of the runs: the forward's at its top level (as it
always was), each other direction's under its own key ("bwd").

A run that writes elsewhere (gpu.sh's $OUT, an empty folder) starts its file from the
committed one of the same name (benchmarks/results/<card>.csv and .json), so that the
file it gives back holds the other direction's rows too and can replace the committed
one as it is.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path


def card_stem(gpu_name: str) -> str:
    """The results' file stem for a GPU of this name: h200, h100, or gpu for any other card."""
    return "h200" if "H200" in gpu_name else "h100" if "H100" in gpu_name else "gpu"

FWD = "fwd"
DIRECTIONS = (FWD, "bwd")  # the order of the groups in the file


def read_rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """(columns, rows) of a results CSV; ([], []) where there is none."""
    if not path.is_file():
        return [], []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = [{k: ("" if v is None else v) for k, v in r.items()} for r in reader]
        return list(reader.fieldnames or []), rows


def _key(row: dict) -> tuple[str, str, str]:
    return row.get("direction", ""), row.get("model", ""), row.get("seqlens", "")


def _group(direction: str) -> int:
    return DIRECTIONS.index(direction) if direction in DIRECTIONS else len(DIRECTIONS)


class ResultsTable:
    """The rows of one direction written into a results CSV that may hold others.

    keep_unmeasured: keep this direction's earlier rows that this run does not measure
    again (bench_bwd.py); otherwise this run's rows replace all of them (bench_fwd.py:
    the file's forward rows are one run's). base: where path does not exist yet, the
    results file (with its sidecar) it starts as a copy of.
    """

    def __init__(self, path: Path, direction: str, keep_unmeasured: bool, base: Path | None = None):
        self.path = Path(path)
        self.direction = direction
        if base is not None and not self.path.exists() and Path(base).is_file():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(base, self.path)
            sidecar = self.path.with_suffix(".json")
            if Path(base).with_suffix(".json").is_file() and not sidecar.exists():
                shutil.copyfile(Path(base).with_suffix(".json"), sidecar)
        self.columns, old = read_rows(self.path)
        self.old = [r for r in old if keep_unmeasured or r.get("direction") != direction]
        self.measured: list[dict] = []

    def add(self, row: dict) -> None:
        """Adds (or replaces) one row of this direction and rewrites the file."""
        if row.get("direction") != self.direction:
            raise ValueError(f"a {row.get('direction')!r} row in the {self.direction!r} table")
        self.measured = [r for r in self.measured if _key(r) != _key(row)] + [row]
        self.write()

    def rows(self) -> list[dict]:
        """The file's rows as they are written: the kept ones (re-measured ones replaced
        in place), then the new ones, grouped by direction."""
        new = {_key(r): r for r in self.measured}
        rows = [new.pop(_key(r), r) for r in self.old]
        rows += [r for r in self.measured if _key(r) in new]
        return sorted(rows, key=lambda r: _group(r.get("direction", "")))  # stable: keeps the order in a group

    def write(self) -> None:
        rows = self.rows()
        columns = list(self.columns)
        for r in rows:
            columns += [c for c in r if c not in columns]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with tmp.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns, restval="")
                writer.writeheader()
                writer.writerows(rows)
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
        self.columns = columns

    def write_sidecar(self, env: dict) -> None:
        """The run's environment into the sidecar (<csv>.json): the forward's as the top
        level, another direction's under its name; the other directions' are kept."""
        path = self.path.with_suffix(".json")
        try:
            old = json.loads(path.read_text()) if path.is_file() else {}
        except ValueError:
            old = {}
        if self.direction == FWD:
            data = dict(env)
            data.update({d: old[d] for d in DIRECTIONS if d != FWD and isinstance(old.get(d), dict)})
        else:
            data = dict(old)
            data[self.direction] = env
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
