"""Scale runs: the forward and backward at lengths and sizes far past the test suites
(docs/reliability.md, "Scale"), with peak GPU memory and the time of each call.

Cases (bf16 q, k, v, dO; fp32 g, beta, h0, dht; q/k l2norm in the kernel; K = V = 128):

- long:  one sequence of 1,048,576 tokens, H = HV = 1 (--long-tokens, --long-heads).
- wide:  one sequence of 270,000 tokens (a partial last chunk), H = 16, HV = 64: v, o,
         dO and dv hold 2.2e9 elements each, past 2^31 and 32-bit indexing
         (--wide-tokens, --wide-h, --wide-hv).
- oom:   the backward of 1,048,576 tokens at H = 16, HV = 64 (its workspace alone,
         ≈ 1.9 KB a token and value head, exceeds the card): the call must fail with
         an out-of-memory error, leave its inputs as they were and the device usable.

Each of long and wide is checked against the CPU backend in fp64 on the same (rounded)
inputs for the q/k heads in --ref-heads (the first and last by default; each with its
whole GQA group, so dq and dk are the group's sums): relative Frobenius error of o, the
final state and every gradient, against the GPU suite's bounds (0.008, dg 0.02). The
wide case also reruns each checked group alone on the GPU (H = 1, HV = the group) and
reports the largest relative difference to the big call: the same arithmetic at 32-bit
offsets.

Prints one line a case and a table last; writes scale_<card>.json to --out-dir after
every case (cases, and q/k heads of a case, that the file already holds from an earlier
run on the same card and that this run does not repeat are kept, so the work may be split
over several runs with --cases and --ref-heads: the fp64 reference runs one thread per
value head and takes minutes per checked group). The cases run in the order oom,
wide, long (the quick one first).
Runs with `scripts/gpu.sh scale`. `--device cpu --long-tokens 300 --wide-tokens 200
--wide-h 2 --wide-hv 4 --cases long,wide` is a quick check of the script itself
(the CPU backend against itself).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import flashqla
from results_table import card_stem

HERE = Path(__file__).resolve().parent
K = V = 128
BOUNDS = {"o": 0.008, "ht": 0.008, "dq": 0.008, "dk": 0.008, "dv": 0.008, "dg": 0.02, "dbeta": 0.008, "dh0": 0.008}


def make_inputs(T, H, HV, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen)

    x = dict(q=randn(1, T, H, K).bfloat16(), k=randn(1, T, H, K).bfloat16(), v=randn(1, T, HV, V).bfloat16(),
             g=F.logsigmoid(randn(1, T, HV)) / 16, beta=randn(1, T, HV).sigmoid(), h0=randn(1, HV, K, V))
    x["do"] = randn(1, T, HV, V).bfloat16()
    x["dht"] = randn(1, HV, K, V)
    return x


def run(x, device):
    """Forward then backward from the same inputs; outputs and the call's times."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    o, ht = flashqla.chunk_gated_delta_rule_fwd(x["q"], x["k"], x["v"], x["g"], x["beta"], K ** -0.5, x["h0"], True,
                                                use_qk_l2norm_in_kernel=True)
    sync()
    t1 = time.perf_counter()
    grads = flashqla.chunk_gated_delta_rule_bwd(x["q"], x["k"], x["v"], x["g"], x["beta"], K ** -0.5, x["h0"],
                                                x["do"], x["dht"], use_qk_l2norm_in_kernel=True)
    sync()
    t2 = time.perf_counter()
    out = dict(o=o, ht=ht, **dict(zip(("dq", "dk", "dv", "dg", "dbeta", "dh0"), grads)))
    return out, {"fwd_s": t1 - t0, "bwd_s": t2 - t1}


def group_slice(x, h, group):
    """The inputs of q/k head h and its value heads only (H = 1, HV = group)."""
    hv = slice(h * group, (h + 1) * group)
    return dict(q=x["q"][:, :, h:h + 1], k=x["k"][:, :, h:h + 1], v=x["v"][:, :, hv], g=x["g"][:, :, hv],
                beta=x["beta"][:, :, hv], h0=x["h0"][:, hv], do=x["do"][:, :, hv], dht=x["dht"][:, hv])


def out_slice(out, h, group):
    hv = slice(h * group, (h + 1) * group)
    return dict(o=out["o"][:, :, hv], ht=out["ht"][:, hv], dq=out["dq"][:, :, h:h + 1], dk=out["dk"][:, :, h:h + 1],
                dv=out["dv"][:, :, hv], dg=out["dg"][:, :, hv], dbeta=out["dbeta"][:, :, hv], dh0=out["dh0"][:, hv])


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def check_case(name, T, H, HV, device, ref_heads, seed, compare_alone):
    group = HV // H
    x = make_inputs(T, H, HV, device, seed)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    out, times = run(x, device)
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else 0
    finite = all(bool(torch.isfinite(t).all()) for t in out.values())
    result = dict(case=name, tokens=T, h=H, hv=HV, v_elements=T * HV * V, peak_gib=peak / 2**30, finite=finite,
                  **times, heads={})
    print(f"[{name}] T={T} H={H} HV={HV}: forward {times['fwd_s']:.3f} s, backward {times['bwd_s']:.3f} s, "
          f"peak {peak / 2**30:.2f} GiB, all finite: {finite}", flush=True)
    for h in sorted({h % H for h in ref_heads}):
        got = out_slice(out, h, group)
        xs = group_slice(x, h, group)
        t0 = time.perf_counter()
        ref, _ = run({k: v.cpu().double() for k, v in xs.items()}, "cpu")
        errs = {k: rel(got[k], ref[k]) for k in got}
        line = dict(errors=errs, ref_s=time.perf_counter() - t0,
                    within_bounds=all(errs[k] <= BOUNDS[k] for k in errs))
        if compare_alone:  # the same group alone on the GPU: the big call's offsets against small ones
            alone, _ = run(xs, device)
            line["alone_max_rel_diff"] = max(rel(got[k], alone[k]) for k in got)
        result["heads"][h] = line
        worst = max(errs, key=errs.get)
        print(f"[{name}] q/k head {h}: worst {worst} {errs[worst]:.2e} against fp64 "
              f"({'within' if line['within_bounds'] else 'OUTSIDE'} the bounds)"
              + (f", alone on the GPU: max rel diff {line['alone_max_rel_diff']:.1e}" if compare_alone else ""),
              flush=True)
    del out, x
    return result


def checksum(t):
    """A sum of every element, a GiB at a time (no full-size temporary)."""
    flat = t.reshape(-1)
    return sum(float(part.float().sum()) for part in flat.split(1 << 28))


def check_oom(T, H, HV, seed):
    """A backward whose workspace cannot fit: the error, the inputs untouched, the device usable."""
    x = make_inputs(T, H, HV, "cuda", seed)
    sums = {k: checksum(v) for k, v in x.items()}
    base = torch.cuda.memory_allocated()
    result = dict(case="oom", tokens=T, h=H, hv=HV)
    try:
        flashqla.chunk_gated_delta_rule_bwd(x["q"], x["k"], x["v"], x["g"], x["beta"], K ** -0.5, x["h0"], x["do"],
                                            x["dht"], use_qk_l2norm_in_kernel=True)
        torch.cuda.synchronize()
        result["error"] = None
    except torch.OutOfMemoryError as e:
        result["error"] = f"torch.OutOfMemoryError: {str(e).splitlines()[0][:160]}"
    except RuntimeError as e:  # anything else is reported as it is
        result["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    torch.cuda.synchronize()
    result["inputs_unchanged"] = all(checksum(v) == sums[k] for k, v in x.items())
    result["memory_released"] = torch.cuda.memory_allocated() == base
    del x
    small = make_inputs(256, 1, 2, "cuda", seed + 1)
    out, _ = run(small, "cuda")
    result["device_usable"] = all(bool(torch.isfinite(t).all()) for t in out.values())
    print(f"[oom] T={T} H={H} HV={HV}: {result['error']}; inputs unchanged: {result['inputs_unchanged']}, "
          f"memory released: {result['memory_released']}, a call after it: "
          f"{'fine' if result['device_usable'] else 'BROKEN'}", flush=True)
    return result


def save(args, results):
    """results into scale_<card>.json (GPU runs only), keeping the cases an earlier run
    on the same card wrote and this one did not run."""
    if args.device != "cuda":
        return
    args.out_dir.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name()
    path = args.out_dir / f"scale_{card_stem(name)}.json"
    earlier, results = [], json.loads(json.dumps(results, default=str))  # head keys as strings
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("gpu") == name:
            now = {r["case"]: r for r in results}
            for r in old.get("results", []):
                same = now.get(r["case"])
                if same is None:
                    earlier.append(r)
                elif "heads" in r and all(r[k] == same[k] for k in ("tokens", "h", "hv")):
                    # the same case checked on other q/k heads earlier (--ref-heads split over runs)
                    same["heads"] = {**{h: line for h, line in r["heads"].items() if h not in same["heads"]},
                                     **same["heads"]}
    path.write_text(json.dumps(dict(gpu=name, torch=torch.__version__, flashqla=flashqla.__version__,
                                    command=" ".join(sys.argv), results=earlier + results), indent=1, default=str))
    print(f"wrote {path}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="long,wide,oom")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--long-tokens", type=int, default=1 << 20)
    ap.add_argument("--long-heads", type=int, default=1)
    ap.add_argument("--wide-tokens", type=int, default=270_000)
    ap.add_argument("--wide-h", type=int, default=16)
    ap.add_argument("--wide-hv", type=int, default=64)
    ap.add_argument("--oom-tokens", type=int, default=1 << 20)
    ap.add_argument("--ref-heads", default="0,-1", help="q/k heads checked against fp64 (negative: from the end)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", type=Path, default=HERE / "results")
    args = ap.parse_args(argv)
    cases = args.cases.split(",")
    unknown = set(cases) - {"long", "wide", "oom"}
    if unknown:
        ap.error(f"unknown cases: {', '.join(sorted(unknown))}")
    heads = [int(h) for h in args.ref_heads.split(",") if h]
    results = []
    if "oom" in cases and args.device == "cuda":
        results.append(check_oom(args.oom_tokens, args.wide_h, args.wide_hv, args.seed + 2))
        save(args, results)
    if "wide" in cases:
        results.append(check_case("wide", args.wide_tokens, args.wide_h, args.wide_hv, args.device, heads,
                                  args.seed + 1, args.device == "cuda"))
        if args.device == "cuda":
            torch.cuda.empty_cache()
        save(args, results)
    if "long" in cases:
        results.append(check_case("long", args.long_tokens, args.long_heads, args.long_heads, args.device, heads,
                                  args.seed, False))
        save(args, results)

    print("\n| case | tokens | H / HV | forward | backward | peak | worst error vs fp64 | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    ok = True
    for r in results:
        if r["case"] == "oom":
            good = bool(r["error"]) and r["inputs_unchanged"] and r["memory_released"] and r["device_usable"]
            print(f"| oom | {r['tokens']} | {r['h']} / {r['hv']} | | | | {r['error']} | "
                  f"{'clean failure' if good else 'FAIL'} |")
        else:
            worst = max((max(line["errors"].values()) for line in r["heads"].values()), default=float("nan"))
            good = r["finite"] and all(line["within_bounds"] for line in r["heads"].values())
            print(f"| {r['case']} | {r['tokens']} | {r['h']} / {r['hv']} | {r['fwd_s']:.3f} s | {r['bwd_s']:.3f} s | "
                  f"{r['peak_gib']:.1f} GiB | {worst:.2e} | {'pass' if good else 'FAIL'} |")
        ok = ok and good
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
