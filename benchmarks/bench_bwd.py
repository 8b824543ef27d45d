"""Backward benchmark: flashqla against FLA's Triton kernels, in the same run, on the
32 rows of FlashQLA's published H200 backward table
(benchmarks/anchors/flashqla_h200_bwd.csv, copied from the published figures).

A row is total_tokens split into num_seqs sequences packed with int32 cu_seqlens (B = 1),
h_qk q/k heads, h_v value heads, K = V = 128, bf16. The split is FlashQLA's (--splits
published, the default): its backward benchmark cuts the tokens at num_seqs − 1 points
drawn by torch.randperm from a CPU generator seeded with 42, so "8k_2seq" is 7053 + 1139
tokens and "8k_8seq" has sequences of 161 to 3157 (the lengths of every row go into the
sidecar's "splits"); --splits equal cuts equal sequences, as runs before 2026-12-06 did. Inputs as bench_fwd.py
makes them (FlashQLA's method: q, k = l2norm(randn) bf16, v = randn bf16,
g = logsigmoid(randn)/16 fp32 with a random 25% of value heads at g = 0,
beta = sigmoid(randn) fp32, h0 = randn fp32, scale = K^-1/2, output_final_state=True),
do = randn bf16 and dht = randn fp32; gradients for q, k, v, g, beta and h0. Per row:

- flashqla_ms: flashqla's backward given what its training forward saves, which is
  only the forward's inputs (the backward recomputes everything):
  flashqla.chunk_gated_delta_rule_bwd(q, k, v, g, beta, scale, h0, do, dht, ...),
  everything it launches.
- fla_ms: FLA's chunk_gated_delta_rule_bwd (fla.ops.gated_delta_rule.chunk) called as
  its autograd Function's backward calls it, on what its training forward saves (the
  chunk-local cumsum of g, A, the chunk indices); FLA's forward runs once, outside the
  timed region, to make them.
- train_flashqla_ms / train_fla_ms: a training step through each library's
  differentiable chunk_gated_delta_rule: the forward with inputs that require grad,
  then torch.autograd.grad of (o, final state) with (do, dht).
- train_fwd_ms / infer_fwd_ms: flashqla's forward with inputs that require grad, and
  the same forward under torch.no_grad: what the training forward costs the GPU
  beyond inference (graph replays: autograd's host-side bookkeeping is not counted).

Timing as bench_fwd.py: each callable is captured in a CUDA graph (eager launches,
with the same flush and events, where it cannot be; the timing columns say which);
every timed replay follows an L2 flush and is timed with CUDA events; the figure is
the mean. Autograd steps are warmed up on a side stream before their capture, as
PyTorch's CUDA-graph notes ask for captured backward passes. FLA runs with
flashqla's FLA backend switched off (FLA_FLASHQLA=0), so FLA means FLA's own kernels.

FLA (0.5.x, 0.6.x) refuses its own backward on Hopper with Triton >= 3.4 and < 3.7.1
(FLA issue #640: gated chunk_bwd_dqkwg at a block size of 64). With K = 128 Hopper
uses 128, and FLA's gradients there match an fp64 reference, so the guard is
bypassed the way it is written (fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True);
the run says so in its output and its sidecar.

Writes the rows (direction=bwd) into the card's results CSV
(benchmarks/results/h200.csv on an H200, h100.csv on an H100, gpu.csv on any other),
replacing only the backward rows it measured again and keeping every forward row
(results_table.py: a new file elsewhere, such as gpu.sh's $OUT, starts as a copy of
the committed one of its name); the sidecar's "bwd" key holds the run's environment.
Plots the speedups over FLA as <card>_bwd.png next to the CSV and prints a summary:
geomean speedups over FLA (backward, training step) and the rows at or above
FlashQLA's published backward speedup (fla_ms / flash_qla_ms of the anchors; the
published backward table has no FlashInfer column). gpu.sh's BENCH_TIME_LIMIT stops a
run with SIGTERM: the rows measured so far are kept, plotted and summarised.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import signal
import statistics
import sys
import time
from pathlib import Path

# bench_fwd sets FLA_FLASHQLA=0 (FLA's own kernels for the baseline) before flashqla loads.
from bench_fwd import L2Flush, card_name, environment, make_inputs, time_graph

import torch  # noqa: E402

import flashqla  # noqa: E402
from results_table import ResultsTable, read_rows  # noqa: E402
from bwd_rows import read_anchors, row_shape  # noqa: E402

HERE = Path(__file__).resolve().parent
CHUNK = 64  # FLA's chunk size (its default), for the tensors its forward saves
GRADS = ("dq", "dk", "dv", "dg", "dbeta", "dh0")
LEAVES = ("q", "k", "v", "g", "beta", "initial_state")  # the inputs the gradients are for


# --- the published rows ------------------------------------------------------------------

# --- FLA -------------------------------------------------------------------------------------

def bypass_hopper_guard() -> str:
    """Turns off FLA's refusal of its gated backward on Hopper with Triton >= 3.4, < 3.7.1
    (FLA #640) the way the guard is written. Returns a note for the output where the guard
    would have fired on this machine, '' where not."""
    try:
        chunk_o = importlib.import_module("fla.ops.common.chunk_o")
    except ImportError:
        return ""
    if not hasattr(chunk_o, "TRITON_ABOVE_3_7_1"):
        return ""
    fires = (bool(getattr(chunk_o, "IS_NVIDIA_HOPPER", False)) and bool(getattr(chunk_o, "TRITON_ABOVE_3_4_0", True))
             and not chunk_o.TRITON_ABOVE_3_7_1)
    chunk_o.TRITON_ABOVE_3_7_1 = True
    if not fires:
        return ""
    return ("FLA's Hopper guard (Triton >= 3.4, < 3.7.1: gated chunk_bwd_dqkwg, FLA #640) bypassed with "
            "fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True: the bug concerns a block size of 64, and with "
            "K = 128 Hopper uses 128 (FLA's gradients there match an fp64 reference)")


def bind(fn, kwargs: dict) -> dict:
    """The keyword arguments of kwargs that fn's signature has (FLA's releases differ in
    which they take). Raises naming any parameter without a default that none gives."""
    params = inspect.signature(fn).parameters
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    missing = [n for n, p in params.items() if p.kind in named and p.default is p.empty and n not in kwargs]
    if missing:
        raise TypeError(f"{fn.__module__}.{fn.__qualname__} has parameters this benchmark does not give: {missing}")
    return {k: v for k, v in kwargs.items() if k in params}


class Fla:
    """FLA's differentiable chunk_gated_delta_rule, and its training forward and backward
    called as its autograd Function (ChunkGatedDeltaRuleFunction) calls them; for FLA
    0.5.x and 0.6.x, whose chunk_gated_delta_rule_fwd/_bwd take (q, k, v, g, beta, [A,]
    scale, initial_state, [do, dht,] ..., cu_seqlens, chunk_indices, ...) by keyword."""

    def __init__(self):
        chunk = importlib.import_module("fla.ops.gated_delta_rule.chunk")
        self.guard_note = bypass_hopper_guard()
        self.autograd = chunk.chunk_gated_delta_rule
        self._fwd, self._bwd = chunk.chunk_gated_delta_rule_fwd, chunk.chunk_gated_delta_rule_bwd
        self._chunk_indices = importlib.import_module("fla.ops.utils.index").prepare_chunk_indices

    def saved(self, x: dict) -> dict:
        """What FLA's training forward saves for its backward, from one call of its
        forward (under no_grad, as autograd runs a Function's forward)."""
        cu, cu_cpu = x["cu_seqlens"], x["cu_seqlens_cpu"]
        host = {"cu_seqlens_cpu": cu_cpu} if "cu_seqlens_cpu" in inspect.signature(self._chunk_indices).parameters \
            else {}
        chunk_indices = self._chunk_indices(cu, CHUNK, **host)
        args = bind(self._fwd, dict(
            q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=x["scale"],
            initial_state=x["initial_state"], output_final_state=True, state_v_first=False, cu_seqlens=cu,
            cp_context=None, chunk_indices=chunk_indices, use_gate_in_kernel=False, A_log=None, dt_bias=None,
            chunk_size=CHUNK))
        with torch.no_grad():
            out = self._fwd(**args)
        # (g cumsum, o, A, final_state[, initial_state, g_input]), as both releases return it
        g_cum, o, A = out[0], out[1], out[2]
        h0 = out[4] if len(out) > 4 else x["initial_state"]
        if (g_cum.shape != x["g"].shape or o.shape != x["v"].shape or tuple(A.shape[:3]) != tuple(x["v"].shape[:3])
                or (h0 is not None and h0.shape != x["initial_state"].shape)):
            raise RuntimeError("FLA's chunk_gated_delta_rule_fwd returned something other than "
                               "(g, o, A, final_state, initial_state, ...): " + ", ".join(
                                   str(tuple(t.shape)) if isinstance(t, torch.Tensor) else repr(t) for t in out))
        return dict(q=x["q"], k=x["k"], v=x["v"], g=g_cum, beta=x["beta"], A=A, scale=x["scale"], initial_state=h0,
                    cu_seqlens=cu, chunk_indices=chunk_indices)

    def backward(self, saved: dict, do, dht, dtypes: dict):
        """A callable running FLA's backward as its autograd Function's backward does (its
        l2norm and beta-sigmoid steps are off for these inputs): (dq, dk, dv, dg, dbeta, dh0),
        cast to the inputs' dtypes (dtypes: name -> dtype)."""
        args = bind(self._bwd, dict(saved, do=do, dht=dht, state_v_first=False, cp_context=None,
                                    use_gate_in_kernel=False, g_input=None, A_log=None, dt_bias=None,
                                    chunk_size=CHUNK))
        bwd = self._bwd

        def run():
            dq, dk, dv, db, dg, dh0 = bwd(**args)[:6]
            return (dq.to(dtypes["q"]), dk.to(dtypes["k"]), dv.to(dtypes["v"]), dg.to(dtypes["g"]),
                    db.to(dtypes["beta"]), dh0)

        return run


# --- timing ----------------------------------------------------------------------------------

class Stopped(BaseException):
    """SIGTERM (gpu.sh's BENCH_TIME_LIMIT) or Ctrl-C: the run ends after writing what it
    measured. A BaseException, so that no `except Exception` on the way swallows it."""


_stop_requested: list[str] = []


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _stop_requested.append(signal.Signals(signum).name)
    raise Stopped(_stop_requested[0])


def _check_stop():
    if _stop_requested:  # an exception on the way may have replaced the Stopped raised
        raise Stopped(_stop_requested[0])


def _device_lost() -> bool:
    """Whether the CUDA context is unusable after a failure (a sticky error: an illegal
    address, a failed launch, a device-side assert): then the run cannot go on."""
    try:
        torch.cuda.synchronize()
        torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
        return False
    except Exception:  # noqa: BLE001
        return True


def warm_on_side_stream(fn, n=3):
    """Warm-up for a callable that runs autograd's backward, before its capture: on a side
    stream, as PyTorch's CUDA-graph notes ask (whole-network capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(n):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


class Timer:
    """bench_fwd.py's timing (time_graph) of one callable; a callable that fails gives
    NaN and its error, printed once per measurement and kept for the sidecar."""

    def __init__(self, flush, reps):
        self.flush, self.reps = flush, reps
        self.errors: dict[str, str] = {}

    def __call__(self, what: str, fn, autograd=False) -> tuple[float, str]:
        try:
            if autograd:
                warm_on_side_stream(fn)
            result = time_graph(fn, self.flush, self.reps)
        except Exception as e:  # noqa: BLE001 - one measurement failing leaves the others
            _check_stop()
            if _device_lost():
                raise
            self.failed(what, e)
            result = math.nan, "failed"
        _check_stop()
        return result

    def failed(self, what: str, e: Exception):
        lines = str(e).strip().splitlines()
        message = f"{type(e).__name__}: {lines[0] if lines else ''}"
        if self.errors.get(what) != message:
            print(f"  {what} failed: {message}", flush=True)
        self.errors[what] = message

    def once(self, what: str, fn):
        """fn's result, or None where it fails (reported as a failed measurement)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001
            _check_stop()
            if _device_lost():
                raise
            self.failed(what, e)
            return None


def rel_diffs(ours, ref) -> dict[str, float]:
    """||ours - ref|| / ||ref|| per gradient (fp32)."""
    out = {}
    for name, a, b in zip(GRADS, ours, ref):
        if a is None or b is None:
            continue
        a, b = a.float(), b.float()
        out[name] = ((a - b).norm() / b.norm()).item()
    return out


def training_step(forward, x: dict, do, dht):
    """One training step through a library's differentiable chunk_gated_delta_rule: the
    forward on x (whose LEAVES require grad), then the gradients of (o, final state)."""
    leaves = tuple(x[n] for n in LEAVES)

    def step():
        o, ht = forward(**x)
        return torch.autograd.grad((o, ht), leaves, (do, dht))

    return step


def measure_row(shape, fla: Fla | None, timer: Timer) -> dict:
    """The row's figures (ms, timing methods, gradient differences to FLA)."""
    seqlens, h_qk, h_v = shape
    x = make_inputs(seqlens, h_qk, h_v)
    dev = x["v"].device
    gen = torch.Generator(device=dev).manual_seed(1)
    do = torch.randn(x["v"].shape, device=dev, generator=gen).to(x["v"].dtype)
    dht = torch.randn(x["initial_state"].shape, device=dev, generator=gen)
    nan = (math.nan, "-")
    m = dict(bwd=nan, fla_bwd=nan, train=nan, fla_train=nan, train_fwd=nan, infer_fwd=nan, diffs={})
    start = time.perf_counter()
    fla_s = 0.0  # seconds in FLA's calls (its first ones compile and autotune)

    low = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=x["scale"],
               initial_state=x["initial_state"], do=do, dht=dht, cu_seqlens=x["cu_seqlens"],
               cu_seqlens_cpu=x["cu_seqlens_cpu"])

    def ours_bwd():
        return flashqla.chunk_gated_delta_rule_bwd(**low)

    with torch.no_grad():  # as autograd runs a backward
        m["bwd"] = timer("flashqla backward", ours_bwd)
        ours = timer.once("flashqla backward", ours_bwd) if not math.isnan(m["bwd"][0]) else None
        if fla is not None:
            t = time.perf_counter()
            dtypes = {n: x[n].dtype for n in ("q", "k", "v", "g", "beta")}
            fla_bwd = timer.once("FLA backward", lambda: fla.backward(fla.saved(x), do, dht, dtypes))
            if fla_bwd is not None:
                m["fla_bwd"] = timer("FLA backward", fla_bwd)
                ref = timer.once("FLA backward", fla_bwd) if not math.isnan(m["fla_bwd"][0]) else None
                if ours is not None and ref is not None:
                    m["diffs"] = rel_diffs(ours, ref)
                del fla_bwd, ref
            fla_s += time.perf_counter() - t
        del ours

    xt = dict(x)
    for n in LEAVES:
        xt[n] = x[n].detach().requires_grad_(True)
    m["train"] = timer("flashqla training step", training_step(flashqla.chunk_gated_delta_rule, xt, do, dht),
                       autograd=True)
    if fla is not None:
        t = time.perf_counter()
        m["fla_train"] = timer("FLA training step", training_step(fla.autograd, xt, do, dht), autograd=True)
        fla_s += time.perf_counter() - t
    m["train_fwd"] = timer("flashqla training forward", lambda: flashqla.chunk_gated_delta_rule(**xt), autograd=True)
    with torch.no_grad():
        m["infer_fwd"] = timer("flashqla inference forward", lambda: flashqla.chunk_gated_delta_rule(**x))
    m["seconds"] = (time.perf_counter() - start, fla_s)
    return m


def result_row(r: dict, shape, m: dict) -> dict:
    seqlens, h_qk, h_v = shape
    (ours, ours_how), (theirs, theirs_how) = m["bwd"], m["fla_bwd"]
    (train, train_how), (fla_train, fla_train_how) = m["train"], m["fla_train"]
    (train_fwd, train_fwd_how), (infer_fwd, infer_fwd_how) = m["train_fwd"], m["infer_fwd"]
    worst = max(m["diffs"], key=m["diffs"].get) if m["diffs"] else ""
    row = {
        "direction": "bwd", "model": r["model"], "seqlens": r["seqlen"], "h_qk": h_qk, "h_v": h_v,
        "flashqla_ms": f"{ours:.4f}", "fla_ms": f"{theirs:.4f}", "speedup_vs_fla": f"{theirs / ours:.3f}",
        "published_best_speedup": f"{float(r['fla_ms']) / float(r['flash_qla_ms']):.3f}",
        "pairs": len(seqlens) * h_v,
        "rel_diff_vs_fla": f"{m['diffs'][worst]:.2e}" if worst else "nan",
        "timing": f"{ours_how}/{theirs_how}",
        "train_flashqla_ms": f"{train:.4f}", "train_fla_ms": f"{fla_train:.4f}",
        "train_speedup_vs_fla": f"{fla_train / train:.3f}",
        "train_fwd_ms": f"{train_fwd:.4f}", "infer_fwd_ms": f"{infer_fwd:.4f}",
        "train_over_infer_fwd": f"{train_fwd / infer_fwd:.3f}",
        "rel_diff_worst": worst,  # the gradient whose difference rel_diff_vs_fla is (the largest)
        "train_timing": f"{train_how}/{fla_train_how};{train_fwd_how}/{infer_fwd_how}",
    }
    # The published backward table has FlashQLA and FLA columns only; should a FlashInfer
    # column come, its speedup is kept and plotted as well.
    if r.get("flashinfer_ms"):
        row["published_flashinfer_speedup"] = f"{float(r['fla_ms']) / float(r['flashinfer_ms']):.3f}"
    return row


def progress_line(i: int, n: int, row: dict, seconds: tuple[float, float] | None = None) -> str:
    """The row's figures; seconds: (the row's wall time, of which in FLA's calls)."""
    f = {k: num(v) for k, v in row.items()}
    took = f" | {seconds[0]:.0f} s, FLA {seconds[1]:.0f} s" if seconds else ""
    return (f"[{i:>2}/{n}] {row['model']:>9} {row['seqlens']:>8} H={row['h_qk']:<2} HV={row['h_v']:<3} "
            f"bwd: flashqla {f['flashqla_ms']:7.3f} ms  FLA {f['fla_ms']:7.3f} ms  x{f['speedup_vs_fla']:5.2f} "
            f"(published x{f['published_best_speedup']:4.2f}) | step: flashqla {f['train_flashqla_ms']:7.3f} ms  "
            f"FLA {f['train_fla_ms']:7.3f} ms  x{f['train_speedup_vs_fla']:5.2f} | fwd train/infer "
            f"{f['train_over_infer_fwd']:5.3f} | diff {f['rel_diff_vs_fla']:.1e} ({row['rel_diff_worst'] or '-'})"
            f"{took}")


# --- report ----------------------------------------------------------------------------------

def num(s) -> float:
    try:
        return float(s)
    except (TypeError, ValueError):
        return math.nan


def geomean(values) -> tuple[float, int]:
    vals = [v for v in values if math.isfinite(v) and v > 0]
    return (math.exp(statistics.mean(math.log(v) for v in vals)) if vals else math.nan), len(vals)


def summary(rows: list[dict]) -> list[str]:
    """A short table over the backward rows: geomean speedups over FLA, the training
    forward over the inference forward, and the rows at or above FlashQLA's published
    backward speedup."""
    col = {c: [num(r.get(c)) for r in rows] for c in
           ("speedup_vs_fla", "published_best_speedup", "train_speedup_vs_fla", "train_over_infer_fwd")}
    lines = ["| measure (backward rows)                       | geomean | rows |",
             "|-----------------------------------------------|---------|------|"]
    for label, c in (("backward: flashqla over FLA", "speedup_vs_fla"),
                     ("backward: FlashQLA over FLA (published, H200)", "published_best_speedup"),
                     ("training step: flashqla over FLA", "train_speedup_vs_fla"),
                     ("flashqla forward: training / inference", "train_over_infer_fwd")):
        g, n = geomean(col[c])
        value = f"{g:.3f}" if c == "train_over_infer_fwd" else f"x{g:.3f}"
        lines.append(f"| {label:<45} | {value:>7} | {n:>4} |")
    pairs = [(r, s, p) for r, s, p in zip(rows, col["speedup_vs_fla"], col["published_best_speedup"])
             if math.isfinite(s) and math.isfinite(p)]
    below = [f"{r['model']},{r['seqlens']} (x{s:.2f} < x{p:.2f})" for r, s, p in pairs if s < p]
    lines.append(f"rows at or above FlashQLA's published backward speedup: {len(pairs) - len(below)} of {len(pairs)}")
    if below:
        lines.append("below it: " + "; ".join(below))
    return lines


def plot(rows: list[dict], path: Path, title: str) -> bool:
    """Speedup over FLA per row: flashqla's backward and training step (measured) and
    FlashQLA's published backward speedup. False where matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return False
    series = [("flashqla backward (measured)", "speedup_vs_fla", "tab:blue"),
              ("FlashQLA backward (published, H200)", "published_best_speedup", "tab:gray"),
              ("flashqla training step, fwd + bwd (measured)", "train_speedup_vs_fla", "tab:cyan")]
    # FlashQLA's published backward table has no FlashInfer column; a series only if one comes.
    if any(r.get("published_flashinfer_speedup") for r in rows):
        series.append(("FlashInfer backward (published, H200)", "published_flashinfer_speedup", "tab:orange"))
    n, width = len(rows), 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.42 * n + 2), 5.0))
    for j, (label, c, color) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(n)]
        ax.bar(xs, [num(r.get(c)) for r in rows], width, label=label, color=color)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(n))
    ax.set_xticklabels([f"{r['model']}\n{r['seqlens']}" for r in rows], rotation=90, fontsize=7)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel("speedup over FLA (FLA ms / ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def report(csv_path: Path, measured: int | None = None) -> None:
    """Plot and summary of the backward rows in csv_path (all of them: those of earlier
    runs that this one did not measure again too)."""
    rows = [r for r in read_rows(csv_path)[1] if r.get("direction") == "bwd"]
    if not rows:
        print(f"no backward rows in {csv_path}")
        return
    env = {}
    sidecar = csv_path.with_suffix(".json")
    if sidecar.is_file():
        try:
            env = json.loads(sidecar.read_text()).get("bwd", {})
        except ValueError:
            pass
    png = csv_path.with_name(f"{csv_path.stem}_bwd.png")
    title = (f"GDN backward, speedup over FLA's Triton kernels in the same run "
             f"({env.get('gpu', csv_path.stem)}, FLA {env.get('fla', '?')})")
    if plot(rows, png, title):
        print(f"wrote {png}")
    print()
    print("\n".join(summary(rows)))
    if measured is not None and measured != len(rows):
        print(f"({len(rows)} backward rows in {csv_path.name}; {measured} measured in this run)")


# --- main ------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None,
                    help="the CSV to write the backward rows into (its sidecar: the same name, .json; the plot: "
                         "<name>_bwd.png); default: in --out-dir, named by the card: h200.csv on an H200, h100.csv "
                         "on an H100, gpu.csv on any other")
    ap.add_argument("--out-dir", type=Path, default=HERE / "results",
                    help="where the card-named CSV goes when --out is not given")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--rows", default="", help="regular expression: keep rows whose 'model,seqlens' it matches "
                                                "(e.g. 'hk16_hv32,' or ',32k_' or '^hk4_hv8,8k_1seq$')")
    ap.add_argument("--no-fla", action="store_true", help="time flashqla only")
    ap.add_argument("--splits", choices=("published", "equal"), default="published",
                    help="sequence lengths of the multi-sequence rows: FlashQLA's (random cut points, seed 42) "
                         "or equal")
    ap.add_argument("--plot-only", action="store_true",
                    help="no measurement: the plot and the summary of the backward rows already in --out")
    args = ap.parse_args(argv)

    if args.plot_only:
        if args.out is None:
            ap.error("--plot-only needs --out (the CSV to read)")
        report(args.out)
        return 0

    if args.out is None:
        args.out = args.out_dir / f"{card_name()}.csv"
    anchors = read_anchors(args.rows)
    fla = None if args.no_fla else Fla()
    timer = Timer(L2Flush(), args.reps)
    table = ResultsTable(args.out, "bwd", keep_unmeasured=True, base=HERE / "results" / args.out.name)
    env = environment()
    env["fla_note"] = "FLA timed with its own kernels (FLA_FLASHQLA=0)"
    if fla is not None and fla.guard_note:
        env["fla_guard"] = fla.guard_note
    env["rows_filter"] = args.rows
    env["splits"] = {f"{r['model']},{r['seqlen']}": row_shape(r, args.splits)[0] for r in anchors}
    env["splits_rule"] = args.splits
    env["rows_planned"], env["rows_measured"] = len(anchors), 0
    env["errors"] = timer.errors
    table.write_sidecar(env)
    print(f"{env['gpu']}: flashqla {env['flashqla']}, FLA {env['fla']}, torch {env['torch']}, triton {env['triton']}; "
          f"{len(anchors)} rows, {args.reps} reps; writing {args.out}", flush=True)
    if env.get("fla_guard"):
        print(env["fla_guard"], flush=True)

    signal.signal(signal.SIGTERM, _on_sigterm)
    measured = 0
    try:
        for i, r in enumerate(anchors, 1):
            _check_stop()
            shape = row_shape(r, args.splits)
            m = measure_row(shape, fla, timer)
            row = result_row(r, shape, m)
            table.add(row)
            measured += 1
            env["rows_measured"] = measured
            table.write_sidecar(env)
            print(progress_line(i, len(anchors), row, m["seconds"]), flush=True)
            torch.cuda.empty_cache()  # the row's graphs and their memory pools are gone
    except (Stopped, KeyboardInterrupt) as e:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        env["stopped"] = f"{type(e).__name__} {e} after {measured} of {len(anchors)} rows"
        table.write_sidecar(env)
        print(f"stopped ({env['stopped']}); the rows measured are kept", flush=True)
    report(args.out, measured)
    print(f"wrote {args.out} and {args.out.with_suffix('.json')} (key 'bwd')")
    return 0 if measured == len(anchors) else 1


if __name__ == "__main__":
    sys.exit(main())
