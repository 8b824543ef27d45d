"""Shared helpers for the Python suite: an fp64 per-token reference written in torch
(differentiable, so gradients are checked against autograd through it), random
inputs in FLA's conventions, and the device list (CPU always, CUDA wherever it exists:
GPU tests are marked ``gpu`` and are never skipped on a machine with a GPU)."""

from __future__ import annotations

import math
import socket

import pytest
import torch
import torch.nn.functional as F

HAS_CUDA = torch.cuda.is_available()

requires_gpu = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device on this machine")


def free_port() -> int:
    """A free TCP port on this host, for a test's torch.distributed rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖₂ / ‖ref‖₂ in fp64 (NaN anywhere never passes)."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    if out.shape != ref.shape:
        raise AssertionError(f"shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    if torch.isnan(out).any():
        return math.inf
    denom = ref.norm().item()
    num = (out - ref).norm().item()
    return num / denom if denom > 0 else num


def gdn_reference(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None, state_v_first=False,
                  use_qk_l2norm=False, beta_sigmoid=False, allow_neg_eigval=False):
    """The per-token recurrence in fp64, token by token, straight from the definition:
    S = e^g S; v' = beta (v - S^T k); S += k v'^T; o = scale S^T q. Returns (o, final_state)
    with final_state in fp64 (layout as requested)."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K ** -0.5 if scale is None else scale
    if use_qk_l2norm:
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if beta_sigmoid:
        beta = beta.sigmoid() * (2.0 if allow_neg_eigval else 1.0)
    group = HV // H
    q = q.repeat_interleave(group, dim=2)
    k = k.repeat_interleave(group, dim=2)
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cu = cu_seqlens.tolist()
        spans = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    finals = []
    o = torch.zeros(B, T, HV, V, dtype=torch.float64, device=q.device)
    rows = []
    for n, (b, t0, t1) in enumerate(spans):
        if initial_state is None:
            S = torch.zeros(HV, K, V, dtype=torch.float64, device=q.device)
        else:
            h0 = initial_state[n].double()
            S = h0.transpose(-1, -2) if state_v_first else h0
        for t in range(t0, t1):
            S = S * g[b, t].exp()[:, None, None]
            vp = beta[b, t][:, None] * (v[b, t] - torch.einsum("hkv,hk->hv", S, k[b, t]))
            S = S + k[b, t][:, :, None] * vp[:, None, :]
            rows.append(((b, t), scale * torch.einsum("hkv,hk->hv", S, q[b, t])))
        finals.append(S.transpose(-1, -2) if state_v_first else S)
    if rows:
        index = torch.tensor([b * T + t for (b, t), _ in rows], device=q.device)
        o = o.reshape(B * T, HV, V).index_copy(0, index, torch.stack([r for _, r in rows])).reshape(B, T, HV, V)
    return o, torch.stack(finals)


def make_inputs(B=1, T=100, H=2, HV=4, K=32, V=32, dtype=torch.float32, device="cpu", cu_seqlens=None,
                h0=True, state_v_first=False, normalize_qk=True, beta_logits=False, seed=0, g_value=None,
                beta_value=None, requires_grad=False):
    """Random inputs in FLA's conventions: q, k l2-normalised (unless the op is asked to
    do it), g = logsigmoid(randn)/4, beta = sigmoid(randn) (or logits), h0 ~ randn fp32."""
    gen = torch.Generator().manual_seed(seed)
    if cu_seqlens is not None:
        B, T = 1, int(cu_seqlens[-1])
    N = B if cu_seqlens is None else len(cu_seqlens) - 1

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q, k = randn(B, T, H, K), randn(B, T, H, K)
    if normalize_qk:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = randn(B, T, HV, V)
    g = F.logsigmoid(randn(B, T, HV)) / 4 if g_value is None else torch.full((B, T, HV), float(g_value))
    if beta_value is not None:
        beta = torch.full((B, T, HV), float(beta_value))
    else:
        beta = randn(B, T, HV) if beta_logits else randn(B, T, HV).sigmoid()
    state = randn(N, HV, V, K) if state_v_first else randn(N, HV, K, V)
    out = dict(
        q=q.to(dtype), k=k.to(dtype), v=v.to(dtype),
        g=g.to(torch.float32 if dtype != torch.float64 else dtype),
        beta=beta.to(torch.float32 if dtype != torch.float64 else dtype),
        initial_state=state.to(torch.float32 if dtype != torch.float64 else dtype) if h0 else None,
    )
    out = {name: (x.to(device) if x is not None else None) for name, x in out.items()}
    if requires_grad:
        for x in out.values():
            if x is not None:
                x.requires_grad_(True)
    if cu_seqlens is not None:
        out["cu_seqlens"] = torch.tensor(cu_seqlens, dtype=torch.int32, device=device)
    return out


def pytest_report_header(config):
    """Which FLA and transformers this run tests against (the suite runs with FLA 0.5.x
    and again with 0.6.x)."""
    import importlib.util

    lines = []
    for name in ("fla", "transformers"):
        spec = importlib.util.find_spec(name)
        if spec is None:
            lines.append(f"{name}: not installed")
            continue
        module = __import__(name)
        lines.append(f"{name}: {getattr(module, '__version__', '?')} ({spec.origin})")
    return lines
