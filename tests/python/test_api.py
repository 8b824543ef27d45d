"""The public Python API: FLA's signature, FLA's errors for bad input, FLA's
acceptance of unknown keywords, flashqla's own refusals (NotImplementedError), errors
a Python caller can act on (TypeError / ValueError naming the argument, never a C
function's name), and the low-level entries."""

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


@pytest.mark.fla
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

def test_unknown_keywords_are_ignored_as_fla_ignores_them(caplog):
    """FLA accepts and ignores keywords it does not know; HF transformers relies on it
    (it passes use_cache, output_router_logits, ... through to the kernel)."""
    x = make_inputs(B=2, T=20, H=2, HV=4, K=8, V=8)
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    with caplog.at_level("DEBUG", logger="flashqla"):
        o2, ht2 = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, use_cache=True,
                                                  output_router_logits=False, unheard_of_keyword=1)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)
    assert "unheard_of_keyword" in caplog.text


def test_cp_context_must_be_flas_context():
    """cp_context is accepted (tests/python/test_fla_cp_context.py); an object without
    FLA's FLACPContext attributes is refused."""
    with pytest.raises(TypeError, match="cp_context must be FLA's FLACPContext"):
        _call(cp_context=object())


def test_head_dim_over_256_not_supported():
    x = make_inputs(T=4, H=1, HV=1, K=320, V=8, h0=False)
    with pytest.raises(NotImplementedError, match="K: key head dim must be in 1..256, got 320"):
        flashqla.chunk_gated_delta_rule(**x)


@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.bool])
def test_integer_inputs_not_supported(dtype):
    x = make_inputs(T=4, H=1, HV=1, K=8, V=8, h0=False)
    with pytest.raises(NotImplementedError, match="v: unsupported dtype"):
        flashqla.chunk_gated_delta_rule(**{**x, "v": x["v"].to(dtype)})


# --------------------------------------------------------------------------------------
# kernel_choice: the core's answer to "which kernel runs this call, and why not the fast one"
# --------------------------------------------------------------------------------------


def test_kernel_choice_on_the_cpu():
    x = make_inputs(cu_seqlens=[0, 30, 100], H=2, HV=4, K=16, V=16)
    choice = flashqla.kernel_choice(**x, output_final_state=True)
    assert isinstance(choice, flashqla.KernelChoice)
    assert choice.kernel == "cpu_chunked"
    assert choice.pieces == "none" and not choice.uses_pieces and choice.piece_chunks == 0
    assert choice.lengths_guessed is False and choice.workspace_bytes == 0
    assert choice.reason == "the CPU backend computes the call (the fused kernel runs CUDA calls only)"


def test_kernel_choice_judges_what_the_forward_passes():
    """An input whose last dimension is strided is copied by the forward op; the choice
    describes that copy (without making it) rather than refusing the view."""
    x = make_inputs(T=40, H=1, HV=2, K=16, V=16)
    v = x["v"].transpose(-1, -2).contiguous().transpose(-1, -2)
    assert v.stride(-1) != 1
    assert flashqla.kernel_choice(**{**x, "v": v}).kernel == "cpu_chunked"
    o, _ = flashqla.chunk_gated_delta_rule(**{**x, "v": v})
    assert o.shape == x["v"].shape


def _refused_inputs(case):
    """Inputs the forward refuses, one way each."""
    x = make_inputs(cu_seqlens=[0, 30, 100], T=100, H=1, HV=2, K=8, V=8, h0=False)
    if case == "K_320":
        return make_inputs(T=4, H=1, HV=1, K=320, V=8, h0=False)
    if case == "int_v":
        return {**x, "v": x["v"].to(torch.int32)}
    if case == "bad_cu_seqlens":
        return {**x, "cu_seqlens": torch.tensor([0, 60, 30], dtype=torch.int32)}
    if case == "strided_cu_seqlens":  # never copied, so refused by both
        return {**x, "cu_seqlens": torch.tensor([0, 0, 30, 0, 100, 0], dtype=torch.int32)[::2]}
    return {**x, "cp_context": object()}


@pytest.mark.parametrize("case", ["K_320", "int_v", "bad_cu_seqlens", "strided_cu_seqlens", "cp_context"])
def test_kernel_choice_refuses_what_the_forward_refuses(case):
    x = _refused_inputs(case)
    with pytest.raises(Exception) as forward:
        flashqla.chunk_gated_delta_rule(**x)
    with pytest.raises(type(forward.value)) as choice:
        flashqla.kernel_choice(**x)
    assert str(choice.value) == str(forward.value)


def test_backward_kernel_choice_on_the_cpu():
    x = make_inputs(cu_seqlens=[0, 30, 100], H=2, HV=4, K=16, V=16)
    choice = flashqla.backward_kernel_choice(**x, output_final_state=True)
    assert isinstance(choice, flashqla.BackwardKernelChoice)
    assert choice.kernel == "cpu_chunked" and choice.workspace_bytes == 0 and choice.piece_chunks == 0
    assert choice.reason == "the CPU backend computes the call (the tensor-core backward runs CUDA calls only)"


@pytest.mark.parametrize("case", ["K_320", "int_v", "bad_cu_seqlens", "strided_cu_seqlens", "cp_context"])
def test_backward_kernel_choice_refuses_what_the_forward_refuses(case):
    x = _refused_inputs(case)
    with pytest.raises(Exception) as forward:
        flashqla.chunk_gated_delta_rule(**x)
    with pytest.raises(type(forward.value)) as choice:
        flashqla.backward_kernel_choice(**x)
    assert str(choice.value).replace("flashqla_gdn_bwd_kernel_choice", "flashqla_gdn_fwd") == str(forward.value)


def test_wrong_g_shape_names_g():
    x = make_inputs(T=10, H=1, HV=2, K=8, V=8)
    with pytest.raises(ValueError, match=r"g must have shape \[B, T, HV\] = \[1, 10, 2\]"):
        flashqla.chunk_gated_delta_rule(**{**x, "g": x["g"][..., :1]})


def test_initial_state_shape_and_count_without_cu_seqlens():
    x = make_inputs(B=2, T=10, H=1, HV=2, K=8, V=8, h0=False)
    with pytest.raises(ValueError, match=r"initial_state must have shape \[2, 2, 8, 8\]"):
        flashqla.chunk_gated_delta_rule(**{**x, "initial_state": torch.randn(3, 2, 8, 8)})


@pytest.mark.parametrize("bad, message", [
    ([0, 13, 12], "cu_seqlens: must be non-decreasing"),
    ([1, 5, 12], "cu_seqlens: must start at 0"),
    ([0, 5, 11], "cu_seqlens: must end at T = 12"),
])
def test_invalid_cu_seqlens_contents_are_value_errors(bad, message):
    x = make_inputs(cu_seqlens=[0, 5, 12], h0=False)
    with pytest.raises(ValueError, match=message) as info:
        flashqla.chunk_gated_delta_rule(**{**x, "cu_seqlens": torch.tensor(bad, dtype=torch.int32)})
    assert "flashqla_" not in str(info.value)  # no C function names


# --- errors a Python caller can act on: the argument named, no C names ----------------

def _error(**overrides):
    x = make_inputs(B=1, T=12, H=2, HV=4, K=8, V=8, h0=False)
    x.update(overrides)
    with pytest.raises((TypeError, ValueError)) as info:
        flashqla.chunk_gated_delta_rule(**x)
    assert "flashqla_" not in str(info.value), str(info.value)
    return info


def test_cu_seqlens_as_a_list_is_a_type_error():
    info = _error(cu_seqlens=[0, 5, 12])
    assert info.type is TypeError and "cu_seqlens must be a 1-d int32/int64 torch.Tensor" in str(info.value)
    info = _error(cu_seqlens=torch.tensor([0, 5, 12], dtype=torch.int32), cu_seqlens_cpu=(0, 5, 12))
    assert info.type is TypeError and "cu_seqlens_cpu must be" in str(info.value)


@pytest.mark.parametrize("entries", [0, 1])
def test_cu_seqlens_without_boundaries(entries):
    info = _error(cu_seqlens=torch.zeros(entries, dtype=torch.int32))
    assert info.type is ValueError and "cu_seqlens must hold N + 1 >= 2 sequence boundaries" in str(info.value)


def test_cu_seqlens_of_another_dtype_or_rank():
    assert "1-d int32/int64" in str(_error(cu_seqlens=torch.tensor([0.0, 12.0])).value)
    assert "1-d int32/int64" in str(_error(cu_seqlens=torch.tensor([[0, 12]], dtype=torch.int32)).value)


def test_cu_seqlens_cpu_without_cu_seqlens():
    info = _error(cu_seqlens_cpu=torch.tensor([0, 12], dtype=torch.int32))
    assert info.type is ValueError and "cu_seqlens_cpu is given without cu_seqlens" in str(info.value)


@pytest.mark.parametrize("tensor, dim, text", [
    ("q", 2, "q has no heads (q.shape[2] = H = 0"), ("v", 2, "v has no heads (v.shape[2] = HV = 0"),
    ("q", 3, "q has head dim K = 0"), ("v", 3, "v has head dim V = 0"),
])
def test_zero_heads_or_head_dim(tensor, dim, text):
    x = make_inputs(B=1, T=12, H=2, HV=4, K=8, V=8, h0=False)
    shape = list(x[tensor].shape)
    shape[dim] = 0
    over = {tensor: torch.zeros(shape)}
    if tensor == "q":
        over["k"] = torch.zeros(shape)
    info = _error(**over)
    assert info.type is ValueError and text in str(info.value)


def test_empty_batch():
    x = make_inputs(B=1, T=12, H=2, HV=4, K=8, V=8, h0=False)
    empty = {n: x[n][:0] for n in ("q", "k", "v", "g", "beta")}
    assert "batch size B = 0" in str(_error(**empty).value)


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_scale(scale):
    info = _error(scale=scale)
    assert info.type is ValueError and "scale must be finite" in str(info.value)


@pytest.mark.parametrize("scale", ["0.1", True, torch.tensor(0.1)])
def test_scale_of_another_type(scale):
    info = _error(scale=scale)
    assert info.type is TypeError and "scale must be a float or None" in str(info.value)


def test_low_level_entries_check_scale():
    x = make_inputs(B=1, T=12, H=2, HV=4, K=8, V=8, h0=False)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    with pytest.raises(ValueError, match="scale must be finite"):
        flashqla.chunk_gated_delta_rule_fwd(*args, float("nan"), None, False)
    with pytest.raises(ValueError, match="scale must be finite"):
        flashqla.chunk_gated_delta_rule_bwd(*args, float("nan"), None, torch.ones(1, 12, 4, 8), None)


@pytest.mark.parametrize("name", ["q", "k", "v", "g", "beta", "initial_state"])
def test_non_tensor_inputs_are_type_errors(name):
    info = _error(**{name: [[0.0]]})
    assert info.type is TypeError and f"{name} must be a torch.Tensor" in str(info.value)


def test_fused_gate_parameters_are_checked():
    x = make_inputs(B=1, T=12, H=2, HV=4, K=8, V=8, h0=False)
    info = _error(use_gate_in_kernel=True, A_log=torch.zeros(3))
    assert info.type is ValueError and "A_log must be a tensor of HV = 4 values" in str(info.value)
    info = _error(use_gate_in_kernel=True, A_log=torch.zeros(4), dt_bias=torch.zeros(5))
    assert "dt_bias must be a tensor of HV = 4 values" in str(info.value)
    del x


def test_errors_from_the_core_name_python_arguments():
    """What only the core sees (contents of cu_seqlens against its CPU copy) comes back
    as ValueError with the Python argument's name, not the C field's."""
    x = make_inputs(cu_seqlens=[0, 5, 12], h0=False)
    with pytest.raises(ValueError, match=r"^flashqla: cu_seqlens_cpu: differs from cu_seqlens at index 1"):
        flashqla.chunk_gated_delta_rule(**x, cu_seqlens_cpu=torch.tensor([0, 6, 12]))


def test_cu_seqlens_cpu_must_match():
    x = make_inputs(cu_seqlens=[0, 5, 12], h0=False)
    o1, _ = flashqla.chunk_gated_delta_rule(**x, cu_seqlens_cpu=x["cu_seqlens"].clone().long())
    o2, _ = flashqla.chunk_gated_delta_rule(**x)
    assert torch.equal(o1, o2)
    with pytest.raises(ValueError, match="cu_seqlens_cpu: differs from cu_seqlens"):
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
