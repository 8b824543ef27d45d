"""A numpy model of the backward state chain's rounding, two forms side by side.

The tensor-core backward's state chain runs, per 64-token chunk,
    S' = e^{γ_L} S + K̂ᵀ diag(e^{γ_L − γ}) (U0 − W S)
from bf16 inputs (k, W, U0 as the workspace holds them) with S in fp32 and a
bf16 copy of it as the GEMM operand. Two ways to evaluate it:

  two products   y = W bf16(S); Vd = bf16(f0 (U0 − y)); S' = e^{γ_L} S + Kᵀ Vd
  one product    K̃ = bf16(f0 k); P = K̃ᵀ W; B = K̃ᵀ U0;
                 S' = e^{γ_L} S + B + hi bf16(S), hi = bf16(−P), and then
                   one rounding   nothing more
                   lagged lo      + lo bf16(S_prev) in B, lo = bf16(−P − hi),
                                  S_prev the state a chunk before (what the
                                  kernel does: off the chain's path)
                   hi + lo        + lo bf16(S) (exact in P to bf16²)

The one-product form cancels B against P S after rounding P, which loses
accuracy where the state already holds the chunk's values (repeated keys).
This prints the worst relative error of each form against an fp64 evaluation
of the same bf16 inputs over 128 chunks, for random and repetitive keys, with
and without decay, and with β up to 2 (reflections).

    python3 benchmarks/tools/chain_precision_model.py [--chunks N] [--seed S]
"""
import argparse

import numpy as np

K, V, C = 128, 16, 64


def bf16(x):
    """Round to the nearest bf16 (ties to even), kept as float32."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((b + 0x7FFF + ((b >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def f32(x):
    return np.asarray(x, dtype=np.float32)


def mm(a, b):
    """fp32-accumulated product of two fp32 (or bf16-valued) operands."""
    return f32(a.astype(np.float64) @ b.astype(np.float64))


def chunk(rng, keys, beta_range, g_range):
    """One chunk's bf16 inputs (k, W, U0), f0 = e^{γ_L − γ} and e^{γ_L}."""
    if keys is None:
        k = rng.standard_normal((C, K))
        v = rng.standard_normal((C, V))
    else:
        pool_k, pool_v = keys
        idx = rng.integers(0, len(pool_k), C)
        k = pool_k[idx] + 1e-3 * rng.standard_normal((C, K))
        v = pool_v[idx]
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    beta = rng.uniform(*beta_range, C)
    gam = np.cumsum(rng.uniform(*g_range, C))
    a = np.tril((beta[:, None] * (k @ k.T)) * np.exp(gam[:, None] - gam[None, :]), -1)
    m = np.linalg.inv(np.eye(C) + a)
    w = m @ ((beta * np.exp(gam))[:, None] * k)
    u0 = m @ (beta[:, None] * v)
    return bf16(k), bf16(w), bf16(u0), f32(np.exp(gam[-1] - gam)), np.float32(np.exp(gam[-1]))


def worst_errors(rng, chunks, keys, beta_range, g_range):
    """The worst relative error of S over the chunks: two products, then the
    one-product form with one rounding, lagged lo, hi + lo."""
    s0 = rng.standard_normal((K, V))
    ref = s0.copy()
    two, one, lag, hilo = (f32(s0) for _ in range(4))
    prev = None
    worst = np.zeros(4)
    for _ in range(chunks):
        k, w, u0, f0, el = chunk(rng, keys, beta_range, g_range)
        ref = float(el) * ref + k.astype(np.float64).T @ (f0[:, None].astype(np.float64) *
                                                          (u0.astype(np.float64) - w.astype(np.float64) @ ref))
        vd = bf16(f0[:, None] * (u0 - mm(w, bf16(two))))
        two = f32(el * two + mm(k.T, vd))
        kt = bf16(f0[:, None] * k)
        p = mm(kt.T, w)
        hi = bf16(-p)
        lo = bf16(-p - hi)
        b = mm(kt.T, u0)
        one = f32(f32(el * one + b) + mm(hi, bf16(one)))
        st = bf16(lag)
        b_lag = f32(b + mm(lo, prev)) if prev is not None else b
        lag = f32(f32(el * lag + b_lag) + mm(hi, st))
        prev = st
        hilo = f32(f32(el * hilo + b) + mm(hi.astype(np.float64) + lo.astype(np.float64), bf16(hilo)))
        norm = np.linalg.norm(ref)
        worst = np.maximum(worst, [np.linalg.norm(x - ref) / norm for x in (two, one, lag, hilo)])
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    pool = rng.standard_normal((8, K)), rng.standard_normal((8, V))
    cases = [
        ("random keys, decay", None, (0.0, 1.0), (-0.1, -0.001)),
        ("random keys, no decay", None, (0.0, 1.0), (0.0, 0.0)),
        ("random keys, no decay, beta < 2", None, (0.0, 2.0), (0.0, 0.0)),
        ("8 repeated keys, no decay", pool, (0.5, 1.0), (0.0, 0.0)),
        ("8 repeated keys, decay", pool, (0.5, 1.0), (-0.05, -0.001)),
    ]
    print(f"worst relative error of S over {args.chunks} chunks")
    print(f"  {'case':34s} {'two products':>12s} {'one rounding':>12s} {'lagged lo':>12s} {'hi + lo':>12s}")
    for name, keys, beta_range, g_range in cases:
        errs = worst_errors(rng, args.chunks, keys, beta_range, g_range)
        print(f"  {name:34s} " + " ".join(f"{e:12.2e}" for e in errs))


if __name__ == "__main__":
    main()
