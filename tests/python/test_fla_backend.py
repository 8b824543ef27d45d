"""flashqla as a backend of flash-linear-attention's dispatch: registration and its
priority, FLA's entry point really running flashqla (forward and backward, every
calling convention and FLA's fused-gate kwargs), the verifier's refusals (on CUDA, the
policy over what is measured faster than FLA, training calls included), and the
switches (FLA_FLASHQLA=0, FLASHQLA_FLA_BACKEND=0). The same tests pass with FLA 0.5.x
(dispatch in ``fla.ops.backends``) and 0.6.x (``fla.backends``): the suite runs once
with each (scripts/lib/python_env.sh). On a GPU, FLA's function and FLA's
GatedDeltaNet layer run on flashqla's CUDA kernels."""

from __future__ import annotations

import functools
import importlib
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("fla.ops.gated_delta_rule")

import flashqla  # noqa: E402  (registers the backend)
import flashqla.fla_backend  # noqa: E402
from conftest import gdn_reference, make_inputs, rel_error  # noqa: E402
from conftest import requires_gpu  # noqa: E402
from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk_gated_delta_rule  # noqa: E402

pytestmark = pytest.mark.fla

gdr_registry = flashqla.fla_backend.fla_dispatch().registry

gdr_module = importlib.import_module("flashqla.gated_delta_rule")
direct = flashqla.chunk_gated_delta_rule  # the package-level name; never patched below


def backend():
    return gdr_registry._backends["flashqla"]


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls that reach flashqla's function through its module attribute
    (which is what the backend calls)."""
    record = []
    original = gdr_module.chunk_gated_delta_rule

    @functools.wraps(original)  # keeps the signature, which the backend reads to bind FLA's arguments
    def counting(*args, **kwargs):
        record.append((args, kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(gdr_module, "chunk_gated_delta_rule", counting)
    return record


# --------------------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------------------


def test_registered_on_import():
    assert flashqla.fla_backend.is_registered()
    assert "flashqla" in gdr_registry._backends
    be = backend()
    assert be.backend_type == "flashqla" and be.env_var == "FLA_FLASHQLA" and be.package_name == "flashqla"
    assert be.is_available() and be.default_enable


def test_dispatch_layout_of_installed_fla():
    import fla

    major_minor = tuple(int(x) for x in fla.__version__.split(".")[:2])
    layout = flashqla.fla_backend.fla_dispatch().layout
    assert layout == ("fla.backends" if major_minor >= (0, 6) else "fla.ops.backends"), fla.__version__


def test_priority_before_flash_qla():
    be = backend()
    assert "flash_qla" in gdr_registry._backends, "FLA registers QwenLM FlashQLA's backend"
    flash_qla = gdr_registry._backends["flash_qla"]
    assert flash_qla.priority == 3
    assert be.priority < flash_qla.priority
    order = [b.backend_type for b in gdr_registry._get_sorted_backends()]
    assert order.index("flashqla") < order.index("flash_qla")


def test_register_twice_is_idempotent():
    before = list(gdr_registry._backends)
    assert flashqla.fla_backend.register() is True
    assert flashqla.fla_backend.register() is True
    assert list(gdr_registry._backends) == before
    assert [b.backend_type for b in gdr_registry._backends.values()].count("flashqla") == 1
    assert flashqla.fla_backend.is_registered()


def _is_registered_in_subprocess(env_value):
    env = dict(os.environ)
    env.pop("FLASHQLA_FLA_BACKEND", None)
    if env_value is not None:
        env["FLASHQLA_FLA_BACKEND"] = env_value
    code = "import flashqla, flashqla.fla_backend; print(flashqla.fla_backend.is_registered())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_flashqla_fla_backend_env_switch():
    assert _is_registered_in_subprocess("0") == "False"
    assert _is_registered_in_subprocess(None) == "True"


# --------------------------------------------------------------------------------------
# FLA's entry point runs flashqla
# --------------------------------------------------------------------------------------


def _inputs(**kw):
    base = dict(B=2, T=70, H=1, HV=2, K=16, V=16)
    base.update(kw)
    return make_inputs(**base)


def test_keyword_call_runs_flashqla(calls):
    x = _inputs()
    o, ht = fla_chunk_gated_delta_rule(**x, output_final_state=True)
    assert len(calls) == 1
    o2, ht2 = direct(**x, output_final_state=True)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    o_ref, ht_ref = gdn_reference(**x)
    assert rel_error(o, o_ref) < 1e-5 and rel_error(ht, ht_ref) < 1e-5


def test_defaults_return_no_final_state(calls):
    x = _inputs(h0=False)
    del x["initial_state"]
    o, ht = fla_chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])
    assert len(calls) == 1 and ht is None
    assert torch.equal(o, direct(x["q"], x["k"], x["v"], x["g"], x["beta"])[0])
    assert rel_error(o, gdn_reference(**x)[0]) < 1e-5


def test_positional_call_in_fla_order(calls):
    """Every FLA parameter positionally (FLA's order: ..., cu_seqlens, cu_seqlens_cpu, cp_context)."""
    x = _inputs(B=1, T=90, cu_seqlens=[0, 31, 31, 90], state_v_first=True, normalize_qk=False,
                beta_logits=True)
    cu = x["cu_seqlens"]
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], 0.3, x["initial_state"], True, True, True, True, True,
            cu, cu.cpu().clone(), None)
    o, ht = fla_chunk_gated_delta_rule(*args)
    assert len(calls) == 1
    o2, ht2 = direct(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=0.3, initial_state=x["initial_state"],
                     output_final_state=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                     allow_neg_eigval=True, state_v_first=True, cu_seqlens=cu, cu_seqlens_cpu=cu.cpu().clone())
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    o_ref, ht_ref = gdn_reference(**x, scale=0.3, state_v_first=True, use_qk_l2norm=True, beta_sigmoid=True,
                                  allow_neg_eigval=True)
    assert rel_error(o, o_ref) < 1e-5 and rel_error(ht, ht_ref) < 1e-5


def test_mixed_positional_and_keyword_call(calls):
    x = _inputs(B=3, T=40, K=32, V=8)
    o, ht = fla_chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"],
                                       output_final_state=True, chunk_size=32)
    assert len(calls) == 1
    o2, ht2 = direct(**x, output_final_state=True)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


@pytest.mark.parametrize("cu_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("with_cpu_copy", [False, True], ids=["no_cpu_copy", "cpu_copy"])
def test_varlen_state_v_first_l2norm(calls, cu_dtype, with_cpu_copy):
    x = _inputs(B=1, T=100, H=2, HV=4, cu_seqlens=[0, 7, 64, 65, 100], state_v_first=True, normalize_qk=False)
    x["cu_seqlens"] = x["cu_seqlens"].to(cu_dtype)
    extra = dict(cu_seqlens_cpu=x["cu_seqlens"].clone()) if with_cpu_copy else {}
    kw = dict(output_final_state=True, state_v_first=True, use_qk_l2norm_in_kernel=True, **extra)
    o, ht = fla_chunk_gated_delta_rule(**x, **kw)
    assert len(calls) == 1
    o2, ht2 = direct(**x, **kw)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    assert ht.shape == (4, 4, 16, 16)
    o_ref, ht_ref = gdn_reference(**x, state_v_first=True, use_qk_l2norm=True)
    assert rel_error(o, o_ref) < 1e-5 and rel_error(ht, ht_ref) < 1e-5


def test_bfloat16_call(calls):
    x = _inputs(dtype=torch.bfloat16)
    o, ht = fla_chunk_gated_delta_rule(**x, output_final_state=True)
    assert len(calls) == 1 and o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    o2, ht2 = direct(**x, output_final_state=True)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    o_ref, ht_ref = gdn_reference(**x)
    assert rel_error(o, o_ref) < 2e-2 and rel_error(ht, ht_ref) < 1e-2


def test_deprecated_transpose_state_layout(calls):
    x = _inputs(state_v_first=True)
    with pytest.warns(DeprecationWarning):
        o, ht = fla_chunk_gated_delta_rule(**x, output_final_state=True, transpose_state_layout=True)
    assert len(calls) == 1
    o2, ht2 = direct(**x, output_final_state=True, state_v_first=True)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


def _fused_gate_inputs(seed=0, requires_grad=False):
    x = _inputs(B=1, T=80, H=2, HV=4, K=16, V=16, cu_seqlens=[0, 50, 80], beta_logits=True, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    x["g"] = torch.randn(1, 80, 4, generator=gen)  # raw gate (a_proj output)
    A_log = torch.log(torch.empty(4).uniform_(1, 16, generator=gen))
    dt_bias = torch.randn(4, generator=gen) * 0.5
    if requires_grad:
        for t in (x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], A_log, dt_bias):
            t.requires_grad_(True)
    return x, A_log, dt_bias


def test_fused_gate_kwargs_as_gated_deltanet_passes_them(calls):
    x, A_log, dt_bias = _fused_gate_inputs(requires_grad=True)
    gate = dict(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True)
    o, ht = fla_chunk_gated_delta_rule(**x, output_final_state=True, **gate)
    assert len(calls) == 1
    assert calls[0][1]["A_log"] is A_log and calls[0][1]["use_gate_in_kernel"] is True
    o2, ht2 = direct(**x, output_final_state=True, **gate)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)

    g_ref = -A_log.double().exp() * F.softplus(x["g"].double() + dt_bias.double())
    beta_ref = torch.sigmoid(x["beta"].double())
    ref_inputs = dict(x, g=g_ref, beta=beta_ref)
    o_ref, ht_ref = gdn_reference(**ref_inputs)
    assert rel_error(o, o_ref) < 1e-5 and rel_error(ht, ht_ref) < 1e-5

    # gradients reach A_log and dt_bias (and the raw g / beta logits) correctly
    gen = torch.Generator().manual_seed(7)
    w_o, w_h = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    leaves = [x["q"], x["k"], x["v"], x["g"], x["beta"], x["initial_state"], A_log, dt_bias]
    grads = torch.autograd.grad((o * w_o).sum() + (ht * w_h).sum(), leaves)
    grads_ref = torch.autograd.grad((o_ref * w_o.double()).sum() + (ht_ref * w_h.double()).sum(), leaves)
    for name, a, b in zip(["q", "k", "v", "g", "beta", "h0", "A_log", "dt_bias"], grads, grads_ref):
        assert rel_error(a, b) < 1e-4, name


def test_fused_gate_without_dt_bias(calls):
    x, A_log, _ = _fused_gate_inputs(seed=3)
    o, ht = fla_chunk_gated_delta_rule(**x, output_final_state=True, use_gate_in_kernel=True, A_log=A_log,
                                       use_beta_sigmoid_in_kernel=True)
    assert len(calls) == 1
    g_ref = -A_log.double().exp() * F.softplus(x["g"].double())
    o_ref, ht_ref = gdn_reference(**dict(x, g=g_ref, beta=torch.sigmoid(x["beta"].double())))
    assert rel_error(o, o_ref) < 1e-5 and rel_error(ht, ht_ref) < 1e-5


def test_errors_keep_fla_semantics(calls):
    """Inputs FLA itself rejects: the verifier declines, FLA's own checks raise FLA's error."""
    x = _inputs(B=2, cu_seqlens=None)
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        fla_chunk_gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 70, 140], dtype=torch.int32))
    with pytest.raises(ValueError, match="chunk_size"):
        fla_chunk_gated_delta_rule(**x, chunk_size=128)
    assert len(calls) == 0


# --------------------------------------------------------------------------------------
# backward through FLA's entry point
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_backward_through_fla_matches_direct(calls, varlen):
    kw = dict(B=1, T=90, cu_seqlens=[0, 40, 90]) if varlen else dict(B=2, T=50)

    def run(fn):
        x = _inputs(H=2, HV=4, requires_grad=True, normalize_qk=False, beta_logits=True, **kw)
        o, ht = fn(**x, output_final_state=True, use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True)
        gen = torch.Generator().manual_seed(11)
        loss = (o * torch.randn(o.shape, generator=gen)).sum() + (ht * torch.randn(ht.shape, generator=gen)).sum()
        leaves = [x[n] for n in ("q", "k", "v", "g", "beta", "initial_state")]
        return o, ht, torch.autograd.grad(loss, leaves), x

    o, ht, grads, x = run(fla_chunk_gated_delta_rule)
    assert len(calls) == 1
    o2, ht2, grads2, _ = run(direct)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    for name, a, b in zip(("q", "k", "v", "g", "beta", "initial_state"), grads, grads2):
        assert a is not None and a.shape == x[name].shape, name
        assert torch.equal(a, b), name

    # and they are the right gradients (fp64 autograd through the reference)
    o_ref, ht_ref = gdn_reference(**x, use_qk_l2norm=True, beta_sigmoid=True)
    gen = torch.Generator().manual_seed(11)
    loss = ((o_ref * torch.randn(o.shape, generator=gen).double()).sum()
            + (ht_ref * torch.randn(ht.shape, generator=gen).double()).sum())
    grads_ref = torch.autograd.grad(loss, [x[n] for n in ("q", "k", "v", "g", "beta", "initial_state")])
    for name, a, b in zip(("q", "k", "v", "g", "beta", "initial_state"), grads, grads_ref):
        assert rel_error(a, b) < 1e-4, name


# --------------------------------------------------------------------------------------
# the verifier's refusals
# --------------------------------------------------------------------------------------


def _verify(*args, **kwargs):
    return backend().verify("chunk_gated_delta_rule", *args, **kwargs)


def test_verifier_accepts_supported_calls():
    x = _inputs()
    assert _verify(**x) == (True, None)
    assert _verify(x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True) == (True, None)


class _FakeCPContext:
    cu_seqlens = torch.tensor([0, 70], dtype=torch.int32)
    cu_seqlens_cpu = None


@pytest.mark.parametrize("how", ["keyword", "positional"])
def test_verifier_declines_cp_context(how):
    x = _inputs(B=1, h0=False)
    del x["initial_state"]
    if how == "keyword":
        ok, reason = _verify(**x, cp_context=_FakeCPContext())
    else:  # cp_context's place in the installed FLA's order (15th in 0.5.x, 16th in 0.6.x)
        args = [x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, False, False, False, False, False]
        at = flashqla.fla_backend._fla_parameters().index("cp_context")
        args += [None] * (at - len(args)) + [_FakeCPContext()]
        ok, reason = _verify(*args)
    assert ok is False
    assert "cp_context" in reason


@pytest.mark.parametrize("value", [False, True])
def test_verifier_declines_head_first(value):
    ok, reason = _verify(**_inputs(), head_first=value)
    assert ok is False and "head_first" in reason


def test_unknown_kwargs_are_accepted_and_ignored_as_fla_does(calls):
    """FLA ignores keyword arguments it does not know (HF transformers passes use_cache and
    others through); flashqla's backend takes such calls and computes the same result."""
    x = _inputs()
    assert _verify(**x, use_cache=True, output_router_logits=False) == (True, None)
    o, ht = fla_chunk_gated_delta_rule(**x, output_final_state=True, use_cache=True, frobnicate=1)
    assert len(calls) == 1
    o2, ht2 = direct(**x, output_final_state=True)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


def test_verifier_declines_k_512():
    ok, reason = _verify(**_inputs(T=8, K=512, V=16))
    assert ok is False
    assert "K=512" in reason or "512" in reason
    assert "head dim" in reason


# What CUDA calls flashqla takes: policy (measured flags, sm_90) over the core's kernel
# choice. The Python side derives nothing itself: here the choice is a KernelChoice as the
# C predicate reports it, and the refusal follows it; on a GPU (below, marked gpu) the
# choice is the core's own for real tensors.
def _choice(kernel="sm90_fused", reason="", pieces="none", lengths_guessed=False):
    return flashqla.KernelChoice(kernel, pieces, 0 if pieces == "none" else 8, lengths_guessed, 0, reason)


def _backward_choice(kernel="sm90_tensor_core", reason=""):
    return flashqla.BackwardKernelChoice(kernel, 0, 0, reason)


def _refusal(choice=None, use_gate_in_kernel=False, capability=(9, 0), training=False, backward=None):
    """_cuda_refusal over a given kernel choice (and backward kernel choice); also returns
    how often it asked for the forward's."""
    asked = []

    def choose():
        asked.append(True)
        return _choice() if choice is None else choice

    def choose_backward():
        return _backward_choice() if backward is None else backward

    return flashqla.fla_backend._cuda_refusal(choose, use_gate_in_kernel, capability, training=training,
                                              choose_backward=choose_backward), len(asked)


@pytest.fixture
def beats_fla(monkeypatch):
    monkeypatch.setattr(flashqla._library, "CUDA_FORWARD_BEATS_FLA", True)


def test_cuda_fused_kernel_calls_are_taken(beats_fla):
    assert _refusal() == (None, 1)
    assert _refusal(_choice(pieces="passes")) == (None, 1)  # pieces for lengths the host knows
    assert _refusal(_choice(pieces="chained")) == (None, 1)


@pytest.mark.parametrize("capability", [(8, 0), (8, 9), (10, 0), (12, 0)])
def test_cuda_other_gpus_stay_with_fla(beats_fla, capability):
    refusal, asked = _refusal(capability=capability)
    assert "sm_90" in refusal
    assert asked == 0  # the core is not asked: its CUDA kernels do not run there


@pytest.mark.parametrize("reason", ["K = 64: the fused kernel needs K = V = 128",
                                    "q, k and v are float32: the fused kernel needs bfloat16 or float16",
                                    "q's head stride (132 elements, 264 bytes) is not a positive multiple of "
                                    "16 bytes: the fused kernel loads q, k and v by TMA"])
def test_cuda_simple_kernel_calls_stay_with_fla_for_the_cores_reason(beats_fla, reason):
    refusal, _ = _refusal(_choice(kernel="sm90_simple", reason=reason))
    assert reason in refusal and "sm90_simple" in refusal


def test_cuda_fused_gate_taken_where_measured_faster(beats_fla, monkeypatch):
    monkeypatch.setattr(flashqla._library, "CUDA_FUSED_GATE_BEATS_FLA", True)
    assert _refusal(use_gate_in_kernel=True)[0] is None
    monkeypatch.setattr(flashqla._library, "CUDA_FUSED_GATE_BEATS_FLA", False)
    assert "use_gate_in_kernel" in _refusal(use_gate_in_kernel=True)[0]


def test_cuda_plans_on_guessed_lengths_stay_with_fla(beats_fla):
    """The core flags a piece plan made for packed sequences whose lengths it did not know
    (whether it cut them or not); FLA keeps those calls until cu_seqlens_cpu is passed."""
    for pieces in ("none", "passes"):
        assert "cu_seqlens_cpu" in _refusal(_choice(pieces=pieces, lengths_guessed=True))[0]


def test_cuda_declined_while_not_faster(monkeypatch):
    monkeypatch.setattr(flashqla._library, "CUDA_FORWARD_BEATS_FLA", False)
    refusal, asked = _refusal()
    assert "not yet faster" in refusal and asked == 0


def test_cuda_training_calls_stay_with_fla_until_the_backward_is_faster(beats_fla, monkeypatch):
    """Calls whose backward will run (inputs that require gradients, under grad mode) go
    to flashqla only once its backward is measured faster than FLA's; inference calls
    are not affected by that flag."""
    monkeypatch.setattr(flashqla._library, "CUDA_BACKWARD_BEATS_FLA", False)
    refusal, asked = _refusal(training=True)
    assert "require gradients" in refusal and "backward is not yet faster" in refusal
    assert asked == 0  # declined by policy before the core is asked
    assert _refusal(training=False) == (None, 1)
    assert "sm_90" in _refusal(training=True, capability=(8, 0))[0]

    monkeypatch.setattr(flashqla._library, "CUDA_BACKWARD_BEATS_FLA", True)
    assert _refusal(training=True) == (None, 1)
    assert _refusal(training=False) == (None, 1)
    # the forward's rules still hold for training calls
    assert "sm90_simple" in _refusal(_choice(kernel="sm90_simple", reason="K = 64"), training=True)[0]
    assert "cu_seqlens_cpu" in _refusal(_choice(lengths_guessed=True), training=True)[0]


def test_cuda_training_calls_need_the_tensor_core_backward(beats_fla, monkeypatch):
    """A training call goes to flashqla only where its tensor-core backward runs it (the
    core's backward kernel choice): the simple backward is far slower than FLA's. The
    refusal carries the core's reason; inference calls never ask."""
    monkeypatch.setattr(flashqla._library, "CUDA_BACKWARD_BEATS_FLA", True)
    simple = _backward_choice("sm90_simple", "q, k, v: float16: the tensor-core backward takes bfloat16")
    refusal, _ = _refusal(training=True, backward=simple)
    assert "require gradients" in refusal and "sm90_simple" in refusal
    assert "the tensor-core backward takes bfloat16" in refusal
    assert _refusal(training=False, backward=simple) == (None, 1)
    assert _refusal(training=True, backward=_backward_choice()) == (None, 1)


def _prepared(requires_grad=()):
    """The call the verifier prepares (gate unresolved) and its extra keywords, with the
    named inputs requiring gradients."""
    x = _inputs()
    rest = dict(use_gate_in_kernel=True, A_log=torch.zeros(2), dt_bias=torch.zeros(2))
    for name in requires_grad:
        (rest if name in rest else x)[name].requires_grad_(True)
    c = gdr_module._prepare(x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], False, False,
                            False, False, False, None, None, None, None, rest, resolve_gate=False)
    return c, rest


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias"])
def test_training_call_is_any_differentiable_input_under_grad_mode(name):
    is_training = flashqla.fla_backend._is_training_call
    assert is_training(*_prepared()) is False
    c, rest = _prepared(requires_grad=[name])
    assert is_training(c, rest) is True
    with torch.no_grad():
        assert is_training(c, rest) is False
    with torch.inference_mode():
        assert is_training(c, rest) is False


@pytest.mark.parametrize("beats", [False, True])
def test_verifier_takes_cpu_training_calls(beats, monkeypatch):
    """The policy is for CUDA: on the CPU flashqla computes every call FLA hands it,
    training calls included, whatever the flag."""
    monkeypatch.setattr(flashqla._library, "CUDA_BACKWARD_BEATS_FLA", beats)
    assert _verify(**_inputs(requires_grad=True), output_final_state=True) == (True, None)


def test_refusal_copies_no_support_rule():
    """The policy reads the core's answer only: no head size, dtype, stride, pointer or SM
    count in it, and no SM count anywhere in the package."""
    import ast
    import inspect
    import pathlib
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(flashqla.fla_backend._cuda_refusal)))
    nodes = list(ast.walk(tree))
    names = {n.attr for n in nodes if isinstance(n, ast.Attribute)} | {n.id for n in nodes if isinstance(n, ast.Name)}
    names |= {a.arg for n in nodes if isinstance(n, ast.arguments) for a in n.args}
    numbers = {n.value for n in nodes if isinstance(n, ast.Constant) and type(n.value) is int}
    assert not names & {"shape", "size", "stride", "dtype", "data_ptr", "is_contiguous", "multi_processor_count",
                        "sm_count", "q", "k", "v", "cu_seqlens", "cu_seqlens_cpu"}, names
    assert numbers <= {0, 1, 9}, numbers  # sm_90 and the capability's two indices only
    for path in pathlib.Path(flashqla.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert "multi_processor_count" not in text and "sm_count" not in text, path.name


def test_verifier_asks_the_core(monkeypatch):
    """The verifier runs the core's kernel choice on the call as flashqla would make it, and
    declines with the core's own message what the core refuses."""
    asked = []
    original = gdr_module._kernel_choice

    def spy(call):
        asked.append(call)
        return original(call)

    monkeypatch.setattr(gdr_module, "_kernel_choice", spy)
    x = _inputs()
    assert _verify(**x) == (True, None)
    assert len(asked) == 1 and asked[0].q is x["q"] and asked[0].beta_activation == 0

    big = _inputs(T=8, K=512, V=16)
    with pytest.raises(NotImplementedError) as refused:
        flashqla.kernel_choice(**big)
    ok, reason = _verify(**big)
    assert ok is False and str(refused.value) in reason


def test_declined_call_falls_back_to_fla(calls):
    """A call flashqla declines goes to FLA's own implementation (never to flashqla)."""
    x = _inputs(T=8, K=512, V=16)
    try:
        fla_chunk_gated_delta_rule(**x)
    except Exception:  # noqa: BLE001 - FLA's Triton path may not run on CPU at all
        pass
    assert len(calls) == 0


def test_fla_flashqla_env_disables_backend(calls, monkeypatch):
    x = _inputs()
    monkeypatch.setenv("FLA_FLASHQLA", "0")
    assert not backend().is_enabled()
    try:
        fla_chunk_gated_delta_rule(**x, output_final_state=True)
    except Exception:  # noqa: BLE001 - FLA's own (Triton) path may not run on CPU at all
        pass
    assert len(calls) == 0
    monkeypatch.setenv("FLA_FLASHQLA", "1")
    fla_chunk_gated_delta_rule(**x, output_final_state=True)
    assert len(calls) == 1


# --------------------------------------------------------------------------------------
# layouts FLA accepts
# --------------------------------------------------------------------------------------


def test_fla_entry_with_non_contiguous_gates(calls):
    """FLA makes every input contiguous itself, so callers pass views freely (here g and
    beta as columns of one [B, T, HV, 2] gate projection). Through FLA's dispatch these
    must either run on flashqla correctly or be declined by the verifier, never fail."""
    x = _inputs()
    gates = torch.stack([x["g"], x["beta"]], dim=-1)
    y = dict(x, g=gates[..., 0], beta=gates[..., 1])
    assert y["g"].stride(-1) != 1
    o, ht = fla_chunk_gated_delta_rule(**y, output_final_state=True)
    o_ref, ht_ref = gdn_reference(**x)
    assert rel_error(o, o_ref) < 1e-5 and rel_error(ht, ht_ref) < 1e-5


# --------------------------------------------------------------------------------------
# on the GPU: FLA's function and FLA's GatedDeltaNet layer run on flashqla's kernels
# --------------------------------------------------------------------------------------


@pytest.mark.gpu
@requires_gpu
def test_fla_entry_runs_flashqla_on_cuda(calls, monkeypatch):
    x = make_inputs(cu_seqlens=[0, 300, 1000, 1100], H=2, HV=4, K=128, V=128, dtype=torch.bfloat16,
                    device="cuda", seed=5)
    cu_cpu = x["cu_seqlens"].cpu()
    with torch.no_grad():
        o, ht = fla_chunk_gated_delta_rule(**x, cu_seqlens_cpu=cu_cpu, output_final_state=True)
        assert len(calls) == 1
        monkeypatch.setenv("FLA_FLASHQLA", "0")  # FLA's own Triton kernels
        fo, fht = fla_chunk_gated_delta_rule(**x, cu_seqlens_cpu=cu_cpu, output_final_state=True)
        assert len(calls) == 1
    cpu = {n: (t.cpu().double() if t.is_floating_point() else t.cpu()) for n, t in x.items()}
    ref_o, ref_ht = flashqla.chunk_gated_delta_rule(**cpu, output_final_state=True)
    for ours, theirs, ref in ((o, fo, ref_o), (ht, fht, ref_ht)):
        assert rel_error(ours, ref) <= max(1.05 * rel_error(theirs, ref), 5e-3)


@pytest.mark.gpu
@requires_gpu
def test_fla_entry_training_calls_on_cuda_follow_the_backward_policy(calls, monkeypatch):
    """CUDA calls whose backward will run reach flashqla through FLA's dispatch only while
    CUDA_BACKWARD_BEATS_FLA is on (the same call under no_grad always does); then FLA's
    autograd runs flashqla's CUDA backward, with the direct call's gradients."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FLA backend takes CUDA calls on sm_90 only")
    monkeypatch.setattr(flashqla._library, "CUDA_FORWARD_BEATS_FLA", True)
    x = make_inputs(T=200, H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device="cuda", seed=3, requires_grad=True)

    monkeypatch.setattr(flashqla._library, "CUDA_BACKWARD_BEATS_FLA", False)
    ok, reason = backend().verify("chunk_gated_delta_rule", **x, output_final_state=True)
    assert ok is False and "require gradients" in reason
    with torch.no_grad():
        assert backend().verify("chunk_gated_delta_rule", **x, output_final_state=True) == (True, None)

    monkeypatch.setattr(flashqla._library, "CUDA_BACKWARD_BEATS_FLA", True)
    assert backend().verify("chunk_gated_delta_rule", **x, output_final_state=True) == (True, None)
    gen = torch.Generator().manual_seed(4)
    w_o = torch.randn(1, 200, 4, 128, generator=gen).to("cuda", torch.bfloat16)
    w_h = torch.randn(1, 4, 128, 128, generator=gen).cuda()

    def run(fn):
        o, ht = fn(**x, output_final_state=True)
        grads = torch.autograd.grad((o.float() * w_o).sum() + (ht * w_h).sum(), list(x.values()))
        return [o.detach(), ht.detach(), *grads]

    through_fla = run(fla_chunk_gated_delta_rule)
    assert len(calls) == 1
    for name, a, b in zip(["o", "ht", *x], through_fla, run(direct)):
        assert a.is_cuda and torch.equal(a, b), name


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("allow_neg_eigval", [False, True])
def test_gated_deltanet_layer_runs_flashqla_on_cuda(calls, monkeypatch, allow_neg_eigval):
    """FLA's GatedDeltaNet layer (head size 128, bf16, a prefill longer than 64 tokens:
    its chunk mode) calls FLA's chunk_gated_delta_rule with the fused gate, beta logits
    and V-first states; through FLA's dispatch flashqla runs that call, with an error
    against the fp64 oracle no larger than FLA's own kernels make on the same call."""
    layers = pytest.importorskip("fla.layers")
    if not flashqla._library.CUDA_FUSED_GATE_BEATS_FLA:
        pytest.fail("flashqla's fused-gate path is not measured faster than FLA's: FLA keeps GatedDeltaNet's calls")
    torch.manual_seed(0)
    layer = layers.GatedDeltaNet(hidden_size=256, head_dim=128, num_heads=2, num_v_heads=4, expand_v=1,
                                 mode="chunk", allow_neg_eigval=allow_neg_eigval).to("cuda", torch.bfloat16)
    hidden = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ours_layer = layer(hidden)[0]
        assert len(calls) == 1, "FLA's GatedDeltaNet did not run on flashqla"
        x = calls[0][1]
        assert not calls[0][0] and x["use_gate_in_kernel"] is True and x["state_v_first"] is True
        ours = direct(**x)[0]
        monkeypatch.setenv("FLA_FLASHQLA", "0")  # FLA's own kernels on the same call, and layer
        theirs = fla_chunk_gated_delta_rule(**x)[0]
        theirs_layer = layer(hidden)[0]
        assert len(calls) == 1
    cpu = {n: x[n].detach().cpu().double() for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias")}
    g = -cpu["A_log"].exp() * F.softplus(cpu["g"] + cpu["dt_bias"])
    ref, _ = gdn_reference(cpu["q"], cpu["k"], cpu["v"], g, cpu["beta"], use_qk_l2norm=True, beta_sigmoid=True,
                           allow_neg_eigval=allow_neg_eigval)
    assert rel_error(ours, ref) <= 1.1 * rel_error(theirs, ref) + 5e-4, (rel_error(ours, ref), rel_error(theirs, ref))
    assert rel_error(ours_layer, theirs_layer) < 5e-2
