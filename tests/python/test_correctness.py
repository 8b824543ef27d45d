"""Every path of flashqla.chunk_gated_delta_rule against the fp64 per-token reference
(conftest.gdn_reference), forward and gradients of every input, on the CPU backend.
Outputs are compared by ‖out − ref‖ / ‖ref‖; a NaN anywhere fails."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashqla
from conftest import gdn_reference, make_inputs, rel_error

# Tolerances by input dtype: the CPU backend accumulates in fp64, so the error is the
# rounding of inputs/outputs to the dtype.
TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 2e-3}

CASES = {
    # name: make_inputs arguments + op options
    "fixed_len": dict(B=2, T=130, H=2, HV=2),
    "single_token": dict(B=3, T=1, H=1, HV=2),
    "chunk_edges": dict(B=1, T=129, H=1, HV=1, K=64, V=64),
    "varlen": dict(cu_seqlens=[0, 15, 100, 164, 250], H=2, HV=4),
    "varlen_empty_seqs": dict(cu_seqlens=[0, 0, 64, 64, 65, 200], H=1, HV=2),
    "gqa_3": dict(T=90, H=2, HV=6),
    "gqa_8": dict(T=70, H=1, HV=8, K=16, V=16),
    "no_h0": dict(T=100, h0=False),
    "state_v_first": dict(cu_seqlens=[0, 40, 150], H=1, HV=2, K=16, V=48, state_v_first=True),
    "l2norm_in_kernel": dict(T=100, normalize_qk=False, opts=dict(use_qk_l2norm_in_kernel=True)),
    "beta_sigmoid": dict(T=100, beta_logits=True, opts=dict(use_beta_sigmoid_in_kernel=True)),
    "neg_eigval": dict(T=100, beta_logits=True, opts=dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)),
    "g_zero": dict(T=100, g_value=0.0),
    "g_very_negative": dict(T=100, g_value=-20.0),
    "beta_zero": dict(T=80, beta_value=0.0),
    "beta_one": dict(T=80, beta_value=1.0),
    "head_dims_100_256": dict(T=70, H=1, HV=1, K=100, V=256),
}


def _run(case, dtype, requires_grad=False, device="cpu"):
    spec = dict(case)
    opts = spec.pop("opts", {})
    x = make_inputs(dtype=dtype, device=device, requires_grad=requires_grad, **spec)
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, state_v_first=spec.get("state_v_first", False),
                                            **opts)
    return x, opts, o, ht


def _reference(x, opts, state_v_first):
    return gdn_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                         cu_seqlens=x.get("cu_seqlens"), state_v_first=state_v_first,
                         use_qk_l2norm=opts.get("use_qk_l2norm_in_kernel", False),
                         beta_sigmoid=opts.get("use_beta_sigmoid_in_kernel", False),
                         allow_neg_eigval=opts.get("allow_neg_eigval", False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_reference(name, dtype):
    case = CASES[name]
    x, opts, o, ht = _run(case, dtype)
    ref_o, ref_ht = _reference(x, opts, case.get("state_v_first", False))
    assert o.dtype == dtype and ht.dtype == torch.float32
    assert rel_error(o, ref_o) <= TOL[dtype], name
    assert rel_error(ht, ref_ht) <= 1e-5, name


@pytest.mark.parametrize("name", ["fixed_len", "varlen_empty_seqs", "gqa_3", "state_v_first", "l2norm_in_kernel",
                                  "neg_eigval", "g_very_negative", "beta_one", "no_h0"])
def test_gradients_match_reference(name):
    """Gradients of every input in fp64 against autograd through the reference,
    with both outputs in the loss (so dht is exercised)."""
    case = {**CASES[name]}
    x, opts, o, ht = _run(case, torch.float64, requires_grad=True)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(ht.shape, generator=gen, dtype=torch.float64)
    names = [n for n in ("q", "k", "v", "g", "beta", "initial_state") if x[n] is not None]
    ours = torch.autograd.grad([o, ht], [x[n] for n in names], [do, dht])
    ref_o, ref_ht = _reference(x, opts, case.get("state_v_first", False))
    theirs = torch.autograd.grad([ref_o, ref_ht], [x[n] for n in names], [do, dht])
    for n, a, b in zip(names, ours, theirs):
        assert a.dtype == x[n].dtype, n
        assert rel_error(a, b) <= 1e-10, f"{name}: d{n}"


def test_gradients_without_final_state_in_loss():
    x = make_inputs(cu_seqlens=[0, 50, 130], H=1, HV=2, K=16, V=16, dtype=torch.float64, requires_grad=True)
    o, _ = flashqla.chunk_gated_delta_rule(**x)
    ours = torch.autograd.grad(o.square().sum(), [x["q"], x["g"], x["initial_state"]])
    ref_o, _ = gdn_reference(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                             cu_seqlens=x["cu_seqlens"])
    theirs = torch.autograd.grad(ref_o.square().sum(), [x["q"], x["g"], x["initial_state"]])
    for a, b in zip(ours, theirs):
        assert rel_error(a, b) <= 1e-10


def test_low_precision_gradients():
    """bf16 inputs: gradients against the fp64 reference on the same rounded inputs."""
    x, opts, o, ht = _run(CASES["varlen"], torch.bfloat16, requires_grad=True)
    do = torch.randn_like(o)
    names = ["q", "k", "v", "g", "beta", "initial_state"]
    ours = torch.autograd.grad(o, [x[n] for n in names], do)
    ref_o, _ = _reference(x, opts, False)
    theirs = torch.autograd.grad(ref_o, [x[n] for n in names], do.double())
    for n, a, b in zip(names, ours, theirs):
        assert a.dtype == x[n].dtype
        assert rel_error(a, b) <= (1e-5 if x[n].dtype == torch.float32 else 8e-3), n


def test_strided_views_of_a_packed_projection():
    """q, k, v as slices of one packed qkv tensor (only the last dim contiguous)."""
    B, T, H, HV, K, V = 1, 150, 2, 4, 32, 16
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, T, 2 * H * K + HV * V + 8, generator=gen)
    q = qkv[..., : H * K].view(B, T, H, K)
    k = qkv[..., H * K: 2 * H * K].view(B, T, H, K)
    v = qkv[..., 2 * H * K: 2 * H * K + HV * V].view(B, T, HV, V)
    assert not q.is_contiguous() and not v.is_contiguous()
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V)
    o, ht = flashqla.chunk_gated_delta_rule(q, k, v, x["g"], x["beta"], initial_state=x["initial_state"],
                                            output_final_state=True, use_qk_l2norm_in_kernel=True)
    o2, ht2 = flashqla.chunk_gated_delta_rule(q.contiguous(), k.contiguous(), v.contiguous(), x["g"], x["beta"],
                                              initial_state=x["initial_state"], output_final_state=True,
                                              use_qk_l2norm_in_kernel=True)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


def test_fused_gate_matches_explicit_gate():
    """FLA's use_gate_in_kernel: g := -exp(A_log) * softplus(g + dt_bias), differentiable."""
    x = make_inputs(T=90, H=1, HV=2, K=16, V=16, dtype=torch.float64, requires_grad=True)
    raw = torch.randn(1, 90, 2, dtype=torch.float64, requires_grad=True)
    A_log = torch.randn(2, dtype=torch.float64, requires_grad=True)
    dt_bias = torch.randn(2, dtype=torch.float64, requires_grad=True)
    o, _ = flashqla.chunk_gated_delta_rule(**{**x, "g": raw}, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    g = -A_log.float().double().exp() * F.softplus(raw.float().double() + dt_bias.float().double())
    ref_o, _ = gdn_reference(x["q"], x["k"], x["v"], g, x["beta"], initial_state=x["initial_state"])
    assert rel_error(o, ref_o) <= 1e-6  # the gate is computed in fp32, as FLA does
    grads = torch.autograd.grad(o.sum(), [raw, A_log, dt_bias])
    assert all(torch.isfinite(g_).all() and g_.abs().sum() > 0 for g_ in grads)


def test_repeated_runs_are_bitwise_identical():
    x = make_inputs(cu_seqlens=[0, 100, 101, 300], H=2, HV=4, dtype=torch.bfloat16)
    first = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    for _ in range(2):
        again = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
