"""Summary table of `scripts/gpu.sh compare`'s output (compare.txt): per version,
the mean over its rounds of each timed case (µs a chunk of one CTA's chain, or ms
for the throughput cases of >= 128 chains) with the number of rounds, and the
largest relative difference to the simple kernel."""

import re
import statistics
import sys


def chains(case):
    """(sequence, value head) pairs of a case line "B=4 T=8192 H=16 HV=64"."""
    fields = dict(f.split("=") for f in case.split() if "=" in f)
    return int(fields["B"]) * int(fields["HV"])


def main(path):
    versions = {}  # name -> {"cases": {case: [values]}, "unit": {case: unit}, "diff": float | None}
    current = None
    case = None
    for line in open(path, encoding="utf-8"):
        m = re.match(r"=== (\S+)", line)
        if m:
            current = versions.setdefault(m.group(1), {"cases": {}, "unit": {}, "diff": None})
            case = None
            continue
        if current is None:
            continue
        if line.startswith("B="):
            case = line.strip()
            continue
        m = re.search(r"([0-9.]+) ms, ([0-9.]+) us per chunk", line)
        if m and case is not None:
            throughput = chains(case) >= 128
            current["cases"].setdefault(case, []).append(float(m.group(1) if throughput else m.group(2)))
            current["unit"][case] = "ms" if throughput else "µs"
            continue
        m = re.search(r"relative difference to the simple kernel: ([0-9.e+-]+)", line)
        if m:
            current["diff"] = max(current["diff"] or 0.0, float(m.group(1)))
    cases = []
    for v in versions.values():
        cases += [c for c in v["cases"] if c not in cases]
    print("| version | " + " | ".join(cases) + " | max rel. diff |")
    print("|---" * (len(cases) + 2) + "|")
    for name, v in versions.items():
        cells = []
        for c in cases:
            values = v["cases"].get(c)
            cells.append("-" if not values else
                         f"{statistics.mean(values):.4g} {v['unit'][c]} (n={len(values)})")
        diff = "-" if v["diff"] is None else f"{v['diff']:.2e}"
        print(f"| {name} | " + " | ".join(cells) + f" | {diff} |")


if __name__ == "__main__":
    main(sys.argv[1])
