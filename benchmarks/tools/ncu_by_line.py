#!/usr/bin/env python3
"""Nsight Compute's per-instruction figures of one kernel, summed by source line.

`scripts/gpu.sh ncu` writes source.csv: one row per SASS instruction (executed
count, warp-state samples by stall reason) but no source lines. This maps each
row to its line through the SASS of a -lineinfo build of the same sources
(nvdisasm -g), then prints, for the instructions executed at least --min-exec
times, the instructions executed and the samples per source line, largest first,
and the stall reasons of all of them. Run here, on the files the device call
brought back:

  benchmarks/tools/ncu_by_line.py source.csv --cubin tool.cubin [--function NAME] [--kernel bfloat16]
      [--per 512] [--range 4300:9700]

--per divides the executed counts (e.g. warps x chunks: 4 x 128 for the
producer of a one-sequence 8192-token run); --range limits the rows to SASS
instruction indices [a, b) (a side's loop, found from the executed counts).
The cubin: the one of fused_chunk_latency.cu that `scripts/gpu.sh ncu` extracts
from the profiled binary (cuobjdump -xelf all; -lineinfo is among the library's
flags).
"""
import argparse
import csv
import re
import subprocess
from collections import Counter, defaultdict


def sass_lines(cubin, function, kernel, nvdisasm):
    text = subprocess.run([nvdisasm, "-g", "-c", cubin], check=True, capture_output=True, text=True).stdout
    functions = re.split(r"\n(?=\.text\.)", text)
    chosen = [f for f in functions if f.startswith(".text.") and function in f.split("\n", 1)[0]
              and kernel in f.split("\n", 1)[0]]
    if len(chosen) != 1:
        raise SystemExit(f"expected one {function} matching {kernel!r} in {cubin}, found {len(chosen)}")
    where, lines = None, {}
    for line in chosen[0].split("\n"):
        m = re.match(r'\s*//## File "([^"]+)", line (\d+)', line)
        if m:
            where = f"{m.group(1).split('/')[-1]}:{m.group(2)}"
            continue
        m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            lines[int(m.group(1), 16) // 16] = (where, m.group(2).strip())
    return lines


def number(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("source_csv")
    ap.add_argument("--cubin", required=True)
    ap.add_argument("--function", default="gdn_fwd_fused_kernel",
                    help="the kernel's name (e.g. gdn_bwd_tc_chain_kernel)")
    ap.add_argument("--kernel", default=None,
                    help="a further substring of its mangled name (default: bfloat16 for the fused kernel)")
    ap.add_argument("--nvdisasm", default="nvdisasm")
    ap.add_argument("--per", type=float, default=1.0)
    ap.add_argument("--range", default=None, help="a:b, SASS instruction indices")
    ap.add_argument("--min-exec", type=float, default=100)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()

    rows = list(csv.reader(open(args.source_csv)))
    header, data = rows[1], rows[2:]
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "(Not Issued)" not in h]
    if args.kernel is None:
        args.kernel = "bfloat16" if args.function == "gdn_fwd_fused_kernel" else ""
    sass = sass_lines(args.cubin, args.function, args.kernel, args.nvdisasm)
    if len(sass) != len(data):
        raise SystemExit(f"{len(data)} profiled instructions, {len(sass)} in the cubin: not the same build")
    lo, hi = (int(v) for v in args.range.split(":")) if args.range else (0, len(data))
    lo, hi = max(lo, 0), min(hi, len(data))

    by_line = defaultdict(lambda: [0.0, 0.0])
    reasons = Counter()
    mismatched = 0
    for i in range(lo, hi):
        r = data[i]
        opcode = [w for w in r[col["Source"]].split() if not w.startswith("@")][:1]
        if opcode and opcode[0] != [w for w in sass[i][1].split() if not w.startswith("@")][0]:
            mismatched += 1
        executed = number(r[col["Instructions Executed"]])
        if executed < args.min_exec:
            continue
        entry = by_line[sass[i][0]]
        entry[0] += executed
        entry[1] += number(r[col["Warp Stall Sampling (All Samples)"]])
        for s in stalls:
            reasons[s[len("stall_"):]] += number(r[col[s]])
    if mismatched:
        print(f"warning: {mismatched} opcodes differ between the profile and the cubin")
    total = sum(v[0] for v in by_line.values())
    print(f"instructions executed / {args.per:g}: {total / args.per:.0f}; samples: {sum(v[1] for v in by_line.values()):.0f}")
    print("stall reasons:", ", ".join(f"{k} {int(v)}" for k, v in reasons.most_common() if v > 0))
    for where, (executed, samples) in sorted(by_line.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"  {where:40s} {executed / args.per:8.1f} {int(samples):5d}")


if __name__ == "__main__":
    main()
