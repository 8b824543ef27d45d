"""The public Python API: FLA's signature, FLA's errors for bad input, flashqla's own
refusals (NotImplementedError / TypeError), and the low-level entries."""

from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch

import flashqla
from conftest import make_inputs, rel_error

# FLA 0.5.x's chunk_gated_delta_rule parameters, in order, with defaults.
# (chunk_indices sits before cp_context as in FLA's newer signature; 0.5.2 reads it
# from **kwargs.)
FLA_PARAMETERS = [
    ("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty), ("v", inspect.Parameter.empty),
    ("g", inspect.Parameter.empty), ("beta", inspect.Parameter.empty), ("scale", None),
    ("initial_state", None), ("output_final_state", False), ("use_qk_l2norm_in_kernel", False),
    ("use_beta_sigmoid_in_kernel", False), ("allow_neg_eigval", False), ("state_v_first", False),
    ("cu_seqlens", None), ("cu_seqlens_cpu", None), ("chunk_indices", None), ("cp_context", None),
]


def _call(**overrides):
    x = make_inputs(B=2, T=20, H=2, HV=4, K=8, V=8)
    x.update(overrides)
    return flashqla.chunk_gated_delta_rule(**x)


def test_signature_matches_fla():
    params = list(inspect.signature(flashqla.chunk_gated_delta_rule).parameters.values())
    assert [(p.name, p.default) for p in params[:-1]] == FLA_PARAMETERS
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params[:-1])
    assert params[-1].kind == inspect.Parameter.VAR_KEYWORD


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="flash-linear-attention not installed")
def test_signature_covers_installed_fla():
    pytest.importorskip("fla.ops.gated_delta_rule")
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_fn

    ours = inspect.signature(flashqla.chunk_gated_delta_rule).parameters
    theirs = [p for p in inspect.signature(fla_fn).parameters.values() if p.kind != p.VAR_KEYWORD]
    for p in theirs:
        assert p.name in ours, f"FLA parameter {p.name} missing"
        assert ours[p.name].default == p.default, f"default of {p.name} differs from FLA's"
    order = [name for name in ours if name in {p.name for p in theirs}]
    assert order == [p.name for p in theirs], "FLA's parameter order is not preserved"


def test_outputs_and_dtypes():
    x = make_inputs(B=2, T=70, H=1, HV=2, K=16, V=24, dtype=torch.bfloat16)
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    assert o.shape == (2, 70, 2, 24) and o.dtype == torch.bfloat16
    assert ht.shape == (2, 2, 16, 24) and ht.dtype == torch.float32
    o, ht = flashqla.chunk_gated_delta_rule(**x)
    assert ht is None
    x["initial_state"] = x["initial_state"].transpose(-1, -2).contiguous()
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, state_v_first=True)
    assert ht.shape == (2, 2, 24, 16)


def test_scale_none_is_inverse_sqrt_k():
    x = make_inputs(T=30, K=16, V=8)
    o_default, _ = flashqla.chunk_gated_delta_rule(**x)
    o_explicit, _ = flashqla.chunk_gated_delta_rule(**x, scale=16 ** -0.5)
    assert torch.equal(o_default, o_explicit)
    o_half, _ = flashqla.chunk_gated_delta_rule(**x, scale=0.5 * 16 ** -0.5)
    assert rel_error(o_half, 0.5 * o_default) < 1e-6


# --- FLA's errors, same types and messages --------------------------------------------

def test_head_count_mismatch():
    x = make_inputs(T=10, H=2, HV=4, K=8, V=8)
    with pytest.raises(ValueError, match=r"q and k must have the same number of heads, but got "
                                         r"q.shape\[2\]=2 and k.shape\[2\]=1"):
        flashqla.chunk_gated_delta_rule(**{**x, "k": x["k"][:, :, :1]})


def test_hv_not_multiple_of_h():
    x = make_inputs(T=10, H=2, HV=3, K=8, V=8)
    with pytest.raises(ValueError, match=r"For GVA, num_v_heads \(HV=3\) must be evenly divisible by "
                                         r"num_heads \(H=2\), but got HV % H = 1"):
        flashqla.chunk_gated_delta_rule(**x)


def test_head_first_is_rejected_whatever_its_value():
    for value in (False, True):
        with pytest.raises(DeprecationWarning, match="head_first has been removed"):
            _call(head_first=value)


def test_batch_must_be_one_with_cu_seqlens():
    x = make_inputs(B=2, T=10, h0=False)
    with pytest.raises(ValueError, match="The batch size is expected to be 1 rather than 2 when using `cu_seqlens`"):
        flashqla.chunk_gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 10], dtype=torch.int32))


def test_initial_state_count_with_cu_seqlens():
    x = make_inputs(cu_seqlens=[0, 5, 12], h0=False)
    with pytest.raises(ValueError, match=r"i.e., 2 rather than 3"):
        flashqla.chunk_gated_delta_rule(**{**x, "initial_state": torch.randn(3, 4, 32, 32)})


def test_chunk_size_values():
    for ok in (16, 32, 64):
        _call(chunk_size=ok)
    with pytest.raises(ValueError, match="`chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got 128."):
        _call(chunk_size=128)


def test_allow_neg_eigval_needs_beta_sigmoid():
    with pytest.raises(ValueError, match="`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`."):
        _call(allow_neg_eigval=True)


def test_transpose_state_layout_is_deprecated_alias():
    x = make_inputs(T=20, K=8, V=16, state_v_first=True)
    with pytest.warns(DeprecationWarning, match="renamed to `state_v_first`"):
        o1, h1 = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, transpose_state_layout=True)
    o2, h2 = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, state_v_first=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2)
    with pytest.raises(ValueError, match="Cannot pass both `state_v_first` and the deprecated"):
        flashqla.chunk_gated_delta_rule(**x, state_v_first=True, transpose_state_layout=True)


def test_gate_in_kernel_needs_a_log():
    with pytest.raises(AssertionError, match="A_log must be provided when use_gate_in_kernel=True."):
        _call(use_gate_in_kernel=True)


# --- flashqla's own refusals ------------------------------------------------------------

def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        _call(bogus=1)


def test_cp_context_not_supported():
    with pytest.raises(NotImplementedError, match="cp_context"):
        _call(cp_context=object())


def test_head_dim_over_256_not_supported():
    x = make_inputs(T=4, H=1, HV=1, K=320, V=8, h0=False)
    with pytest.raises(NotImplementedError, match="K=320"):
        flashqla.chunk_gated_delta_rule(**x)


def test_integer_inputs_not_supported():
    x = make_inputs(T=4, H=1, HV=1, K=8, V=8, h0=False)
    with pytest.raises(NotImplementedError, match="v has dtype torch.int32"):
        flashqla.chunk_gated_delta_rule(**{**x, "v": x["v"].to(torch.int32)})


def test_wrong_g_shape_names_g():
    x = make_inputs(T=10, H=1, HV=2, K=8, V=8)
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV\] = \[1, 10, 2\]"):
        flashqla.chunk_gated_delta_rule(**{**x, "g": x["g"][..., :1]})


def test_initial_state_shape_and_count_without_cu_seqlens():
    x = make_inputs(B=2, T=10, H=1, HV=2, K=8, V=8, h0=False)
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 2, 8, 8\]"):
        flashqla.chunk_gated_delta_rule(**{**x, "initial_state": torch.randn(3, 2, 8, 8)})


def test_invalid_cu_seqlens_contents_are_reported():
    x = make_inputs(cu_seqlens=[0, 5, 12], h0=False)
    bad = torch.tensor([0, 13, 12], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="cu_seqlens: must be non-decreasing"):
        flashqla.chunk_gated_delta_rule(**{**x, "cu_seqlens": bad})


def test_cu_seqlens_cpu_must_match():
    x = make_inputs(cu_seqlens=[0, 5, 12], h0=False)
    o1, _ = flashqla.chunk_gated_delta_rule(**x, cu_seqlens_cpu=x["cu_seqlens"].clone().long())
    o2, _ = flashqla.chunk_gated_delta_rule(**x)
    assert torch.equal(o1, o2)
    with pytest.raises(RuntimeError, match="cu_seqlens_host: differs from cu_seqlens"):
        flashqla.chunk_gated_delta_rule(**x, cu_seqlens_cpu=torch.tensor([0, 6, 12]))


def test_chunk_indices_is_accepted_and_unused():
    x = make_inputs(cu_seqlens=[0, 5, 70], h0=False)
    o1, _ = flashqla.chunk_gated_delta_rule(**x, chunk_indices=torch.zeros(3, 2, dtype=torch.int32))
    o2, _ = flashqla.chunk_gated_delta_rule(**x)
    assert torch.equal(o1, o2)


# --- low-level entries ------------------------------------------------------------------

def test_low_level_fwd_bwd_match_autograd():
    x = make_inputs(cu_seqlens=[0, 30, 30, 100], H=1, HV=2, K=16, V=16, dtype=torch.float64, requires_grad=True)
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, use_qk_l2norm_in_kernel=True)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    torch.autograd.backward([o, ht], [do, dht])
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], 16 ** -0.5, x["initial_state"])
    o2, ht2 = flashqla.chunk_gated_delta_rule_fwd(*args, True, cu_seqlens=x["cu_seqlens"],
                                                  use_qk_l2norm_in_kernel=True)
    assert torch.equal(o.detach(), o2.detach()) and torch.equal(ht.detach(), ht2.detach())
    grads = flashqla.chunk_gated_delta_rule_bwd(*args, do, dht, cu_seqlens=x["cu_seqlens"],
                                                use_qk_l2norm_in_kernel=True)
    for name, grad in zip(("q", "k", "v", "g", "beta", "initial_state"), grads):
        assert rel_error(grad, x[name].grad) < 1e-12, name
    assert grads[5].dtype == torch.float64  # states are fp32, fp64 when the inputs are fp64
    assert flashqla.chunk_gated_delta_rule_bwd(*args[:6], None, do, None, cu_seqlens=x["cu_seqlens"])[5] is None
