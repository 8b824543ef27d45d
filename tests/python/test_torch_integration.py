"""flashqla inside PyTorch's machinery: ``torch.library.opcheck`` on both ops (schema,
autograd registration, fake tensors, AOT dispatch with dynamic shapes), a GDN layer
under ``torch.compile(fullgraph=True)`` with the inductor backend (forward and
backward, static and dynamic token counts, compared with eager), and the op under
``torch.no_grad()`` / ``torch.inference_mode()``."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import flashqla
from conftest import gdn_reference, make_inputs, rel_error

B, T, H, HV, K, V = 1, 70, 1, 2, 16, 16

GDN_FWD = torch.ops.flashqla.gdn_fwd.default
GDN_BWD = torch.ops.flashqla.gdn_bwd.default

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


# --------------------------------------------------------------------------------------
# opcheck
# --------------------------------------------------------------------------------------

# Each case: the op's optional arguments and flags. "cu" is the cu_seqlens list (with an
# empty sequence in one case: sequences may have any length >= 0).
CASES = {
    "plain": dict(),
    "h0": dict(h0=True),
    "final": dict(final=True),
    "h0_final": dict(h0=True, final=True),
    "varlen_i32": dict(h0=True, final=True, cu=[0, 23, 70], cu_dtype=torch.int32),
    "varlen_i64": dict(h0=True, final=True, cu=[0, 23, 70], cu_dtype=torch.int64),
    "varlen_i32_cpu_copy": dict(h0=True, final=True, cu=[0, 23, 70], cu_dtype=torch.int32, cu_cpu=True),
    "varlen_i64_cpu_copy": dict(h0=True, final=True, cu=[0, 5, 5, 70], cu_dtype=torch.int64, cu_cpu=True),
    "varlen_no_state": dict(cu=[0, 40, 70], cu_dtype=torch.int64, cu_cpu=True),
    "varlen_final_only": dict(final=True, cu=[0, 1, 64, 70], cu_dtype=torch.int32),
    "state_v_first": dict(h0=True, final=True, v_first=True),
    "state_v_first_varlen": dict(h0=True, final=True, v_first=True, cu=[0, 33, 70], cu_dtype=torch.int32),
    "l2norm": dict(h0=True, final=True, l2norm=True),
    "beta_sigmoid": dict(h0=True, final=True, beta_act=1),
    "beta_sigmoid_x2": dict(h0=True, final=True, beta_act=2),
    "everything": dict(h0=True, final=True, v_first=True, l2norm=True, beta_act=2, cu=[0, 17, 70],
                       cu_dtype=torch.int64, cu_cpu=True),
    "strided_views": dict(h0=True, final=True, strided=True),
    "low_precision_gates": dict(h0=True, final=True, gate_dtype_like_q=True),
}


def _inputs(case: dict, dtype: torch.dtype, requires_grad: bool, seed: int = 0, device: str = "cpu"):
    """The op's positional arguments up to cu_seqlens_cpu, as a list (on ``device``; the
    CPU copy of cu_seqlens on the CPU)."""
    cu = case.get("cu")
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, dtype=dtype, cu_seqlens=cu, h0=case.get("h0", False),
                    state_v_first=case.get("v_first", False), normalize_qk=not case.get("l2norm", False),
                    beta_logits=case.get("beta_act", 0) != 0, seed=seed, device=device)
    q, k, v, g, beta, h0 = x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"]
    if case.get("gate_dtype_like_q"):
        g, beta = g.to(dtype), beta.to(dtype)
        h0 = h0.to(dtype) if h0 is not None else None
    if case.get("strided"):
        # q, k, v as views into one packed projection [B, T, H*K + H*K + HV*V], g and beta
        # as views of one [B, T, 2*HV], the state as a slice of a wider buffer: strided
        # everywhere except the last dimension (unit stride there, as the op requires).
        packed = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], dim=-1).contiguous()
        q = packed[..., :H * K].unflatten(-1, (H, K))
        k = packed[..., H * K:2 * H * K].unflatten(-1, (H, K))
        v = packed[..., 2 * H * K:].unflatten(-1, (HV, V))
        gates = torch.cat([g, beta], dim=-1).contiguous()
        g, beta = gates[..., :HV], gates[..., HV:]
        if h0 is not None:
            h0 = torch.cat([h0, torch.zeros_like(h0)], dim=-1)[..., :h0.shape[-1]]
            assert not h0.is_contiguous()
        assert not q.is_contiguous() and not g.is_contiguous()
        if requires_grad:
            # keep the strided views as leaves of the autograd graph
            q, k, v, g, beta = (t.detach().requires_grad_(True) for t in (q, k, v, g, beta))
            assert not q.is_contiguous()
    elif requires_grad:
        for t in (q, k, v, g, beta):
            t.requires_grad_(True)
    if requires_grad and h0 is not None:
        h0.requires_grad_(True)
    cu_seqlens = cu_cpu = None
    if cu is not None:
        cu_seqlens = torch.tensor(cu, dtype=case["cu_dtype"], device=device)
        if case.get("cu_cpu"):
            cu_cpu = torch.tensor(cu, dtype=case["cu_dtype"])
    return [q, k, v, g, beta, K ** -0.5, h0, cu_seqlens, cu_cpu]


def _flags(case: dict):
    return case.get("v_first", False), case.get("l2norm", False), case.get("beta_act", 0)


def _assert_opcheck(result: dict):
    failed = {name: value for name, value in result.items() if value != "SUCCESS"}
    assert not failed, failed
    assert set(OPCHECK_TESTS) <= set(result), result


DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(CASES))
def test_opcheck_gdn_fwd(name, dtype):
    case = CASES[name]
    args = _inputs(case, dtype, requires_grad=True)
    v_first, l2norm, beta_act = _flags(case)
    args += [case.get("final", False), v_first, l2norm, beta_act]
    _assert_opcheck(torch.library.opcheck(GDN_FWD, tuple(args), test_utils=OPCHECK_TESTS))
    # and the op really was differentiable through autograd for every input that asked
    o, ht = GDN_FWD(*args)
    assert o.requires_grad and o.grad_fn is not None


# dht (the final state's gradient) only exists for cases whose forward returns a final state
BWD_CASES = [pytest.param(name, with_dht, id=f"{name}-{'dht' if with_dht else 'no_dht'}")
             for name, case in CASES.items() for with_dht in ((False, True) if case.get("final") else (False,))]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,with_dht", BWD_CASES)
def test_opcheck_gdn_bwd(name, with_dht, dtype):
    case = CASES[name]
    # gdn_bwd is the backward formula itself and has no derivative of its own
    # (double backward is not supported), so its inputs do not require grad.
    args = _inputs(case, dtype, requires_grad=False)
    v_first, l2norm, beta_act = _flags(case)
    gen = torch.Generator().manual_seed(1)
    n = 1 if case.get("cu") is None else len(case["cu"]) - 1
    do = torch.randn(B, T, HV, V, generator=gen).to(dtype)
    dht = None
    if with_dht:
        dht = torch.randn((n, HV, V, K) if v_first else (n, HV, K, V), generator=gen)
    args += [do, dht, v_first, l2norm, beta_act]
    _assert_opcheck(torch.library.opcheck(GDN_BWD, tuple(args), test_utils=OPCHECK_TESTS))


@pytest.mark.parametrize("name", ["h0_final", "everything"])
def test_opcheck_float64(name):
    """fp64 inputs (CPU): states and their gradients are fp64 too."""
    case = CASES[name]
    args = _inputs(case, torch.float64, requires_grad=True)
    v_first, l2norm, beta_act = _flags(case)
    fwd_args = args + [True, v_first, l2norm, beta_act]
    _assert_opcheck(torch.library.opcheck(GDN_FWD, tuple(fwd_args), test_utils=OPCHECK_TESTS))
    o, ht = GDN_FWD(*fwd_args)
    assert o.dtype == torch.float64 and ht.dtype == torch.float64
    bwd_args = [a.detach() if isinstance(a, torch.Tensor) else a for a in args]
    bwd_args += [torch.randn_like(o.detach()), torch.randn_like(ht.detach()), v_first, l2norm, beta_act]
    _assert_opcheck(torch.library.opcheck(GDN_BWD, tuple(bwd_args), test_utils=OPCHECK_TESTS))
    assert GDN_BWD(*bwd_args)[5].dtype == torch.float64


def test_opcheck_gdn_fwd_batched():
    """B > 1 without cu_seqlens (one state per batch row)."""
    x = make_inputs(B=3, T=37, H=1, HV=2, K=16, V=16, requires_grad=True)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], 0.3, x["initial_state"], None, None, True, False, False, 0)
    _assert_opcheck(torch.library.opcheck(GDN_FWD, args, test_utils=OPCHECK_TESTS))
    o, ht = GDN_FWD(*args)
    assert o.shape == (3, 37, 2, 16) and ht.shape == (3, 2, 16, 16)


def test_fake_tensor_shapes_match_real():
    """The fake impls give the real ops' shapes, dtypes and devices."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for name in ("h0_final", "varlen_i64_cpu_copy", "state_v_first_varlen", "plain", "low_precision_gates"):
        case = CASES[name]
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            args = _inputs(case, dtype, requires_grad=False)
            v_first, l2norm, beta_act = _flags(case)
            fwd_args = args + [case.get("final", False), v_first, l2norm, beta_act]
            real = GDN_FWD(*fwd_args)
            do = torch.randn_like(real[0])
            dht = torch.randn_like(real[1]) if case.get("final") else None
            bwd_args = args + [do, dht, v_first, l2norm, beta_act]
            real += GDN_BWD(*bwd_args)
            with FakeTensorMode(allow_non_fake_inputs=False) as mode:
                def fake(a):
                    return mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                faked = GDN_FWD(*map(fake, fwd_args)) + GDN_BWD(*map(fake, bwd_args))
            for r, f in zip(real, faked):
                assert (tuple(r.shape), r.dtype, r.device) == (tuple(f.shape), f.dtype, f.device), (name, dtype)


def _non_unit_last_stride(name: str, t: torch.Tensor) -> torch.Tensor:
    """The same values as ``t`` with a last-dimension stride other than 1."""
    if name == "beta_expanded":
        return t[..., :1].expand(t.shape)  # stride 0, e.g. a constant beta broadcast over heads
    if name == "g_column":
        return torch.stack([t, torch.zeros_like(t)], dim=-1)[..., 0]  # stride 2
    # a transposed (column-major) copy of the last two dimensions
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


@pytest.mark.parametrize("which", ["q_column_major", "v_column_major", "g_column", "beta_expanded",
                                   "initial_state_column_major"])
def test_inputs_with_non_unit_last_stride(which):
    """Any strided tensor is a valid input to a torch op (FLA's function accepts them too):
    the result must equal the one for the contiguous copy, forward and backward."""
    x = make_inputs(B=1, T=40, H=2, HV=4, K=16, V=16, requires_grad=True)
    name = {"q_column_major": "q", "v_column_major": "v", "g_column": "g", "beta_expanded": "beta",
            "initial_state_column_major": "initial_state"}[which]
    if which == "beta_expanded":
        x["beta"] = torch.full_like(x["beta"], 0.7).requires_grad_(True)
    y = dict(x)
    # a leaf of its own (detach keeps the strides), so its gradient is comparable
    y[name] = _non_unit_last_stride(which, x[name].detach()).requires_grad_(True)
    assert torch.equal(y[name], x[name]) and y[name].stride(-1) != 1
    o_ref, ht_ref = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    grads_ref = torch.autograd.grad((o_ref.sum() + ht_ref.sum()), list(x.values()))
    o, ht = flashqla.chunk_gated_delta_rule(**y, output_final_state=True)
    grads = torch.autograd.grad((o.sum() + ht.sum()), list(y.values()))
    assert torch.equal(o, o_ref) and torch.equal(ht, ht_ref)
    for a, b in zip(grads, grads_ref):
        assert torch.equal(a, b)


def test_double_backward_is_refused_or_correct():
    """gdn_bwd has no derivative of its own. A second-order gradient must then either be
    refused (an error) or be right; a silent wrong value (e.g. zeros) is not acceptable."""
    x = make_inputs(B=1, T=20, H=1, HV=2, K=8, V=8, dtype=torch.float64, requires_grad=True)

    def second_order(o):
        (gv,) = torch.autograd.grad(o.pow(2).sum(), [x["v"]], create_graph=True)
        return torch.autograd.grad(gv.pow(2).sum(), [x["v"]])[0]

    expected = second_order(gdn_reference(**x)[0])
    assert expected.abs().max() > 1e-3
    o, _ = flashqla.chunk_gated_delta_rule(**x)
    try:
        got = second_order(o)
    except RuntimeError:
        return  # refused: fine
    assert rel_error(got, expected) < 1e-6, "double backward returned a wrong gradient without an error"


# --------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------

D_MODEL, CH, CHV, CK, CV = 24, 2, 4, 16, 16


class GDNLayer(nn.Module):
    """A small gated-delta-net layer: projections, gates, flashqla, output projection."""

    def __init__(self, l2norm_in_kernel: bool):
        super().__init__()
        self.l2norm_in_kernel = l2norm_in_kernel
        self.q_proj = nn.Linear(D_MODEL, CH * CK, bias=False)
        self.k_proj = nn.Linear(D_MODEL, CH * CK, bias=False)
        self.v_proj = nn.Linear(D_MODEL, CHV * CV, bias=False)
        self.g_proj = nn.Linear(D_MODEL, CHV)
        self.b_proj = nn.Linear(D_MODEL, CHV)
        self.o_proj = nn.Linear(CHV * CV, D_MODEL, bias=False)

    def forward(self, x, initial_state, cu_seqlens):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, CH, CK)
        k = self.k_proj(x).view(b, t, CH, CK)
        v = self.v_proj(x).view(b, t, CHV, CV)
        if not self.l2norm_in_kernel:
            q, k = F.normalize(q, p=2, dim=-1), F.normalize(k, p=2, dim=-1)
        g = F.logsigmoid(self.g_proj(x))
        beta = torch.sigmoid(self.b_proj(x))
        o, final_state = flashqla.chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=initial_state, output_final_state=True, cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=self.l2norm_in_kernel)
        return self.o_proj(o.reshape(b, t, CHV * CV)), final_state


def _layer_inputs(cu, seed):
    gen = torch.Generator().manual_seed(seed)
    t = cu[-1]
    x = torch.randn(1, t, D_MODEL, generator=gen)
    h0 = (0.5 * torch.randn(len(cu) - 1, CHV, CK, CV, generator=gen)).requires_grad_(True)
    w_out = torch.randn(1, t, D_MODEL, generator=gen)
    w_state = torch.randn(len(cu) - 1, CHV, CK, CV, generator=gen)
    return x, h0, torch.tensor(cu, dtype=torch.int32), w_out, w_state


def _run(model, fn, x, h0, cu, w_out, w_state, mark_tokens_dynamic=False):
    model.zero_grad(set_to_none=True)
    h0 = h0.detach().requires_grad_(True)
    x = x.detach().requires_grad_(True)
    if mark_tokens_dynamic:
        # raises if anything on the path specializes the token count
        torch._dynamo.mark_dynamic(x, 1)
    out, ht = fn(x, h0, cu)
    loss = (out * w_out).sum() + (ht * w_state).sum()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    grads["x"], grads["h0"] = x.grad.clone(), h0.grad.clone()
    return out.detach(), ht.detach(), grads


def _assert_matches_eager(model, compiled, inputs, tol=1e-5, mark_tokens_dynamic=False):
    eager = _run(model, model, *inputs)
    comp = _run(model, compiled, *inputs, mark_tokens_dynamic=mark_tokens_dynamic)
    assert rel_error(comp[0], eager[0]) <= tol
    assert rel_error(comp[1], eager[1]) <= tol
    assert set(comp[2]) == set(eager[2]) and len(comp[2]) == len(list(model.parameters())) + 2
    for name in eager[2]:
        err = rel_error(comp[2][name], eager[2][name])
        assert err <= tol, f"gradient of {name}: rel error {err:.3g}"
    return eager


def _graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("l2norm_in_kernel", [False, True], ids=["F.normalize", "l2norm_in_kernel"])
def test_compile_fullgraph_inductor_forward_backward(l2norm_in_kernel, fresh_dynamo):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(0)
    model = GDNLayer(l2norm_in_kernel)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    inputs = _layer_inputs([0, 30, 31, 75], seed=1)

    eager = _assert_matches_eager(model, compiled, inputs)
    assert counter.frame_count == 1
    assert _graph_breaks() == 0, dict(torch._dynamo.utils.counters["graph_break"])
    # a second call with new values (same shapes) reuses the graph and still matches
    inputs2 = _layer_inputs([0, 12, 60, 75], seed=2)
    _assert_matches_eager(model, compiled, inputs2)
    assert counter.frame_count == 1
    # sanity: the eager layer itself agrees with the fp64 reference recurrence
    x, h0, cu, _, _ = inputs
    with torch.no_grad():
        q = model.q_proj(x).view(1, -1, CH, CK)
        k = model.k_proj(x).view(1, -1, CH, CK)
        v = model.v_proj(x).view(1, -1, CHV, CV)
        g, beta = F.logsigmoid(model.g_proj(x)), torch.sigmoid(model.b_proj(x))
        if not l2norm_in_kernel:
            q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        o_ref, ht_ref = gdn_reference(q, k, v, g, beta, initial_state=h0, cu_seqlens=cu,
                                      use_qk_l2norm=l2norm_in_kernel)
        assert rel_error(eager[1], ht_ref) < 1e-4
        assert rel_error(eager[0], model.o_proj(o_ref.float().reshape(1, -1, CHV * CV))) < 1e-4


def test_explain_reports_no_graph_break(fresh_dynamo):
    model = GDNLayer(l2norm_in_kernel=False)
    x, h0, cu, _, _ = _layer_inputs([0, 20, 50], seed=3)
    explanation = torch._dynamo.explain(model)(x, h0, cu)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compiled_graphs_contain_the_ops(fresh_dynamo):
    """Forward graph calls gdn_fwd, backward graph calls gdn_bwd (each as one opaque op)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = {"fw": [], "bw": []}

    def recorder(kind):
        def compiler(gm, example_inputs):
            graphs[kind].append(gm)
            return make_boxed_func(gm.forward)
        return compiler

    backend = aot_autograd(fw_compiler=recorder("fw"), bw_compiler=recorder("bw"))
    model = GDNLayer(l2norm_in_kernel=True)
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    inputs = _layer_inputs([0, 40, 64], seed=4)
    _assert_matches_eager(model, compiled, inputs)

    def targets(gms):
        return [n.target for gm in gms for n in gm.graph.nodes if n.op == "call_function"]

    assert targets(graphs["fw"]).count(GDN_FWD) == 1
    assert targets(graphs["bw"]).count(GDN_BWD) == 1
    assert GDN_BWD not in targets(graphs["fw"])


def test_compile_without_initial_state_and_unused_final_state(fresh_dynamo):
    """No initial state, and a loss that ignores the final state (its gradient is None)."""
    model = GDNLayer(l2norm_in_kernel=False)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x, _, cu, w_out, _ = _layer_inputs([0, 44, 70], seed=8)
    results = []
    for fn in (model, compiled):
        model.zero_grad(set_to_none=True)
        out, ht = fn(x, None, cu)
        (out * w_out).sum().backward()
        results.append((out.detach(), ht.detach(), [p.grad.clone() for p in model.parameters()]))
    (oe, he, ge), (oc, hc, gc) = results
    assert rel_error(oc, oe) <= 1e-6 and rel_error(hc, he) <= 1e-6
    for a, b in zip(gc, ge):
        assert rel_error(a, b) <= 1e-6
    assert _graph_breaks() == 0


@pytest.mark.parametrize("mode", ["mark_dynamic", "dynamic=True"])
def test_compile_dynamic_token_count(mode, fresh_dynamo):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(5)
    model = GDNLayer(l2norm_in_kernel=False)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=(mode == "dynamic=True"))
    for i, cu in enumerate(([0, 33, 70], [0, 64, 101], [0, 3, 130])):
        _assert_matches_eager(model, compiled, _layer_inputs(cu, seed=10 + i),
                              mark_tokens_dynamic=(mode == "mark_dynamic"))
    assert counter.frame_count == 1, "a new token count recompiled"
    assert _graph_breaks() == 0


def test_compile_dynamic_sequence_count(fresh_dynamo):
    """The number of packed sequences (len(cu_seqlens) - 1, the state batch) may change too."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch.manual_seed(6)
    model = GDNLayer(l2norm_in_kernel=True)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=True)
    for i, cu in enumerate(([0, 33, 70], [0, 10, 20, 64, 90], [0, 5, 9, 11, 40, 41, 80])):
        _assert_matches_eager(model, compiled, _layer_inputs(cu, seed=20 + i))
    assert counter.frame_count == 1
    assert _graph_breaks() == 0


# --------------------------------------------------------------------------------------
# no_grad / inference_mode
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode], ids=["no_grad", "inference_mode"])
def test_op_under_no_grad_and_inference_mode(context):
    x = make_inputs(B=1, T=70, H=1, HV=2, K=16, V=16, cu_seqlens=[0, 30, 70], state_v_first=True,
                    requires_grad=True)
    expected_o, expected_ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, state_v_first=True)
    assert expected_o.requires_grad
    with context():
        o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, state_v_first=True)
        o_raw, ht_raw = GDN_FWD(x["q"], x["k"], x["v"], x["g"], x["beta"], K ** -0.5, x["initial_state"],
                                x["cu_seqlens"], None, True, True, False, 0)
    for out in (o, ht, o_raw, ht_raw):
        assert not out.requires_grad and out.grad_fn is None
    if context is torch.inference_mode:
        assert o.is_inference() and ht.is_inference()
    assert torch.equal(o, expected_o.detach()) and torch.equal(ht, expected_ht.detach())
    assert torch.equal(o_raw, o) and torch.equal(ht_raw, ht)
    o_ref, ht_ref = gdn_reference(**{n: t.detach() for n, t in x.items()}, state_v_first=True)
    assert rel_error(o, o_ref) < 1e-5 and rel_error(ht, ht_ref) < 1e-5


def test_inference_mode_inputs():
    """Inputs created under inference_mode (inference tensors) work there, and the
    backward low-level entry works there too."""
    with torch.inference_mode():
        x = make_inputs(B=2, T=40, H=1, HV=2, K=16, V=16)
        o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
        grads = flashqla.chunk_gated_delta_rule_bwd(x["q"], x["k"], x["v"], x["g"], x["beta"], K ** -0.5,
                                                    x["initial_state"], torch.ones_like(o), torch.ones_like(ht))
    o_ref, ht_ref = gdn_reference(**x)
    assert rel_error(o, o_ref) < 1e-5 and rel_error(ht, ht_ref) < 1e-5
    assert all(t is not None and torch.isfinite(t).all() for t in grads)


def test_compiled_layer_under_no_grad(fresh_dynamo):
    model = GDNLayer(l2norm_in_kernel=True)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    x, h0, cu, _, _ = _layer_inputs([0, 25, 70], seed=7)
    with torch.no_grad():
        out_c, ht_c = compiled(x, h0, cu)
        out_e, ht_e = model(x, h0, cu)
    assert not out_c.requires_grad
    assert rel_error(out_c, out_e) <= 1e-6 and rel_error(ht_c, ht_e) <= 1e-6
