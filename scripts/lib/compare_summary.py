"""Summary table of `scripts/gpu.sh compare`'s output (compare.txt): per
version, the timed cases (µs a chunk of one CTA's chain, or ms for the
throughput cases of >= 128 chains), the largest relative difference to the simple kernel, and each
side alone."""

import re
import sys


def chains(case):
    """(sequence, value head) pairs of a case line "B=4 T=8192 H=16 HV=64"."""
    fields = dict(f.split("=") for f in case.split() if "=" in f)
    return int(fields["B"]) * int(fields["HV"])


def main(path):
    versions = []
    current = None
    section = "timing"
    case = None
    for line in open(path, encoding="utf-8"):
        if line.startswith("=== "):
            name = line[4:].split(":", 1)[0]
            current = {"name": name, "cases": {}, "diff": None, "producer": "-", "state": "-", "distorted": False}
            versions.append(current)
            section, case = "timing", None
            continue
        if current is None:
            continue
        if line.strip().startswith("WARNING:"):
            current["distorted"] = True
            continue
        if line.strip() == "producer alone:":
            section = "producer"
            continue
        if line.strip() == "state alone:":
            section = "state"
            continue
        if line.startswith("B="):
            case = line.strip()
            continue
        m = re.search(r"([0-9.]+) ms, ([0-9.]+) us per chunk", line)
        if m:
            if section == "timing" and case is not None:
                value = f"{m.group(1)} ms" if chains(case) >= 128 else f"{m.group(2)} µs"
                current["cases"][case] = value
            elif section in ("producer", "state"):
                current[section] = f"{m.group(2)} µs"
            continue
        m = re.search(r"relative difference to the simple kernel: ([0-9.e+-]+)", line)
        if m:
            current["diff"] = max(current["diff"] or 0.0, float(m.group(1)))
    cases = []
    for v in versions:
        cases += [c for c in v["cases"] if c not in cases]
    print("| version | " + " | ".join(cases) + " | max rel. diff | producer alone | state alone |")
    print("|---" * (len(cases) + 4) + "|")
    for v in versions:
        cells = [v["cases"].get(c, "-") for c in cases]
        diff = "-" if v["diff"] is None else f"{v['diff']:.2e}"
        print(f"| {v['name']} | " + " | ".join(cells) + f" | {diff} | {v['producer']} | {v['state']} |")
    distorted = [v["name"] for v in versions if v["distorted"]]
    if distorted:
        print(f"\nProfile builds that spill or serialize their wgmmas (their phase cycles and 'alone' "
              f"figures do not describe the kernel): {', '.join(distorted)}")


if __name__ == "__main__":
    main(sys.argv[1])
