"""CUDA tensors. These run wherever CUDA exists (marked ``gpu``; skipped only on
machines without a GPU). The forward is checked against the fp64 oracle (flashqla's
CPU backend on the same inputs, upcast) and against FLA's error on the same inputs;
CUDA graph capture must stay correct when ``cu_seqlens`` contents change; inputs that
require gradients run the CUDA backward, never anything on the CPU (its gradients are
checked in test_gpu_backward.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

import flashqla
from conftest import make_inputs, rel_error, requires_gpu

pytestmark = [pytest.mark.gpu, requires_gpu]

HAS_FLA = importlib.util.find_spec("fla") is not None

CASES = {
    "dense_2x1000": dict(B=2, T=1000, H=2, HV=4, K=128, V=128),
    "varlen_with_empty": dict(cu_seqlens=[0, 0, 63, 64, 64, 1000, 1065, 4096], H=2, HV=8, K=128, V=128),
    "gqa_16": dict(T=512, H=1, HV=16, K=128, V=128),
    "single_token": dict(B=4, T=1, H=1, HV=2, K=128, V=128),
    "head_dim_64": dict(T=700, H=2, HV=4, K=64, V=64),
    "head_dims_96_192": dict(T=300, H=1, HV=2, K=96, V=192),
    "state_v_first": dict(T=300, H=1, HV=2, K=128, V=128, state_v_first=True),
    "no_h0": dict(T=300, H=1, HV=2, K=128, V=128, h0=False),
    "g_zero": dict(T=300, H=1, HV=2, K=128, V=128, g_value=0.0),
    "g_very_negative": dict(T=300, H=1, HV=2, K=128, V=128, g_value=-20.0),
    "beta_one": dict(T=300, H=1, HV=2, K=128, V=128, beta_value=1.0),
}


def _oracle(x, **opts):
    """fp64 outputs of flashqla's CPU backend on the same (rounded) inputs."""
    cpu = {name: (t.detach().cpu().double() if t is not None and t.is_floating_point() else
                  (t.cpu() if t is not None else None)) for name, t in x.items()}
    return flashqla.chunk_gated_delta_rule(**cpu, output_final_state=True, **opts)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_oracle(name, dtype):
    spec = dict(CASES[name])
    state_v_first = spec.get("state_v_first", False)
    x = make_inputs(dtype=dtype, device="cuda", seed=11, **spec)
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, state_v_first=state_v_first)
    ref_o, ref_ht = _oracle(x, state_v_first=state_v_first)
    assert o.dtype == dtype and ht.dtype == torch.float32 and o.is_cuda
    assert rel_error(o, ref_o) <= 5e-3, name
    assert rel_error(ht, ref_ht) <= 5e-3, name


@pytest.mark.parametrize("opts", [dict(use_qk_l2norm_in_kernel=True),
                                  dict(use_beta_sigmoid_in_kernel=True),
                                  dict(use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)])
def test_forward_options_match_oracle(opts):
    x = make_inputs(cu_seqlens=[0, 200, 777], H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, device="cuda",
                    normalize_qk=not opts.get("use_qk_l2norm_in_kernel", False),
                    beta_logits=opts.get("use_beta_sigmoid_in_kernel", False))
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, **opts)
    ref_o, ref_ht = _oracle(x, **opts)
    assert rel_error(o, ref_o) <= 5e-3 and rel_error(ht, ref_ht) <= 5e-3


def test_strided_views_of_packed_qkv():
    B, T, H, HV, K, V = 1, 500, 2, 4, 128, 128
    qkv = torch.randn(B, T, 2 * H * K + HV * V, device="cuda", dtype=torch.bfloat16)
    q = qkv[..., : H * K].view(B, T, H, K)
    k = qkv[..., H * K: 2 * H * K].view(B, T, H, K)
    v = qkv[..., 2 * H * K:].view(B, T, HV, V)
    x = make_inputs(B=B, T=T, H=H, HV=HV, K=K, V=V, device="cuda")
    args = dict(g=x["g"], beta=x["beta"], initial_state=x["initial_state"], output_final_state=True,
                use_qk_l2norm_in_kernel=True)
    o, ht = flashqla.chunk_gated_delta_rule(q, k, v, **args)
    o2, ht2 = flashqla.chunk_gated_delta_rule(q.contiguous(), k.contiguous(), v.contiguous(), **args)
    assert torch.equal(o, o2) and torch.equal(ht, ht2)


def test_repeated_runs_are_bitwise_identical():
    x = make_inputs(cu_seqlens=[0, 100, 2000, 2100], H=2, HV=8, K=128, V=128, dtype=torch.bfloat16, device="cuda")
    first = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    for _ in range(3):
        again = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


@pytest.mark.fla
@pytest.mark.skipif(not HAS_FLA, reason="flash-linear-attention not installed")
def test_error_no_worse_than_fla(monkeypatch):
    pytest.importorskip("fla.ops.gated_delta_rule")
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdr

    monkeypatch.setenv("FLA_FLASHQLA", "0")  # FLA's own Triton kernels, not the flashqla backend
    x = make_inputs(cu_seqlens=[0, 1000, 1500, 4096], H=2, HV=8, K=128, V=128, dtype=torch.bfloat16, device="cuda")
    ref_o, ref_ht = _oracle(x)
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    fo, fht = fla_gdr(**x, output_final_state=True)
    ours, theirs = rel_error(o, ref_o), rel_error(fo, ref_o)
    assert ours <= theirs * 1.05 + 1e-4, f"o: flashqla {ours:.2e} vs FLA {theirs:.2e}"
    ours, theirs = rel_error(ht, ref_ht), rel_error(fht, ref_ht)
    assert ours <= theirs * 1.05 + 1e-4, f"final state: flashqla {ours:.2e} vs FLA {theirs:.2e}"


def test_cuda_graph_replay_follows_cu_seqlens_contents():
    """Captured once; replayed with new cu_seqlens contents (same shapes): no host sync
    may have baked the old boundaries in."""
    _check_graph_replay(HV=4, cu_variants=([0, 300, 1000, 1024], [0, 1, 2, 1024], [0, 512, 512, 1024]))


def _check_graph_replay(HV, cu_variants):
    """Captures one call, replays it after writing each of cu_variants into the captured
    cu_seqlens, and compares with an eager call on the same contents."""
    x = make_inputs(cu_seqlens=[0, 300, 1000, 1024], H=1, HV=HV, K=128, V=128, dtype=torch.bfloat16, device="cuda")
    static = {name: t.clone() if t is not None else None for name, t in x.items()}
    flashqla.chunk_gated_delta_rule(**static, output_final_state=True)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o, ht = flashqla.chunk_gated_delta_rule(**static, output_final_state=True)
    for cu in cu_variants:
        static["cu_seqlens"].copy_(torch.tensor(cu, dtype=torch.int32))
        graph.replay()
        expect_o, expect_ht = flashqla.chunk_gated_delta_rule(**{**static, "cu_seqlens": static["cu_seqlens"].clone()},
                                                              output_final_state=True)
        torch.cuda.synchronize()
        assert torch.equal(o, expect_o) and torch.equal(ht, expect_ht), cu


SEQUENCE_PIECE_CASES = {
    "one_long_sequence": dict(T=4096, H=2, HV=4, K=128, V=128),
    "varlen_with_empty": dict(cu_seqlens=[0, 0, 63, 64, 64, 1000, 1065, 4096], H=1, HV=2, K=128, V=128),
    "no_h0_v_first": dict(T=1500, H=1, HV=2, K=128, V=128, h0=False, state_v_first=True),
}


@pytest.mark.parametrize("mode", ["1", "2"], ids=["piece_passes", "chained"])
@pytest.mark.parametrize("piece_chunks", ["", "2"])
@pytest.mark.parametrize("name", list(SEQUENCE_PIECE_CASES))
def test_sequence_pieces_match_oracle(monkeypatch, name, piece_chunks, mode):
    """Intra-card sequence parallelism, forced on few chains: the same results as whole
    sequences (bitwise for chained pieces, which only hand the fp32 state over; up to
    rounding for the piece passes) and the oracle's."""
    spec = dict(SEQUENCE_PIECE_CASES[name])
    state_v_first = spec.get("state_v_first", False)
    x = make_inputs(dtype=torch.bfloat16, device="cuda", seed=5, **spec)
    monkeypatch.setenv("FLASHQLA_SEQUENCE_PARALLEL", "0")
    whole = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, state_v_first=state_v_first)
    monkeypatch.setenv("FLASHQLA_SEQUENCE_PARALLEL", mode)
    monkeypatch.setenv("FLASHQLA_PIECE_CHUNKS", piece_chunks)
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, state_v_first=state_v_first)
    ref_o, ref_ht = _oracle(x, state_v_first=state_v_first)
    assert rel_error(o, ref_o) <= 5e-3 and rel_error(ht, ref_ht) <= 5e-3, name
    assert rel_error(o, whole[0]) <= 5e-3 and rel_error(ht, whole[1]) <= 5e-3, name
    if mode == "2":
        assert torch.equal(o, whole[0]) and torch.equal(ht, whole[1]), name


@pytest.mark.parametrize("spec", [dict(B=4, T=2048, H=16, HV=48),
                                  dict(cu_seqlens=[0, 2048, 2048, 3000, 5000, 8192], H=16, HV=48)],
                         ids=["27B_2048x4", "varlen_240_chains"])
def test_chained_pieces_by_default_equal_whole_sequences(monkeypatch, spec):
    """With more chains than SMs but a partly idle last wave, the default plan chains
    pieces (on 132 SMs it does for both shapes: test_sequence_pieces.cpp); the results are
    bitwise those of whole sequences (which the oracle checks)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chains = spec.get("B", len(spec.get("cu_seqlens", [0, 0])) - 1) * spec["HV"]
    if chains < sms:
        pytest.skip(f"{chains} chains do not fill this GPU's {sms} SMs")
    x = make_inputs(dtype=torch.bfloat16, device="cuda", seed=9, K=128, V=128, **spec)
    if "cu_seqlens" in spec:
        x["cu_seqlens_cpu"] = x["cu_seqlens"].cpu()
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    monkeypatch.setenv("FLASHQLA_SEQUENCE_PARALLEL", "0")
    whole_o, whole_ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    assert torch.equal(o, whole_o) and torch.equal(ht, whole_ht)


@pytest.mark.parametrize("mode", ["1", "2"], ids=["piece_passes", "chained"])
def test_cuda_graph_replay_with_sequence_pieces(monkeypatch, mode):
    """The piece plan uses only shapes; the pieces (and the chained tickets) come from
    cu_seqlens on the device."""
    monkeypatch.setenv("FLASHQLA_SEQUENCE_PARALLEL", mode)
    monkeypatch.setenv("FLASHQLA_PIECE_CHUNKS", "2")
    _check_graph_replay(HV=2, cu_variants=([0, 1024, 1024, 1024], [0, 1, 2, 1024], [0, 512, 512, 1024]))


def test_inputs_requiring_grad_run_the_cuda_backward():
    """Autograd on CUDA inputs: the forward records the op and the backward runs on the
    GPU (gradients on the inputs' device, in their dtypes, finite)."""
    x = make_inputs(T=64, H=1, HV=2, K=128, V=128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    assert o.requires_grad and ht.requires_grad
    (o.float().sum() + ht.sum()).backward()
    for name, t in x.items():
        assert t.grad is not None and t.grad.is_cuda, name
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype, name
        assert torch.isfinite(t.grad).all(), name
    with torch.no_grad():
        o2, _ = flashqla.chunk_gated_delta_rule(**x)
    assert o2.is_cuda and not o2.requires_grad and torch.equal(o2, o.detach())


@pytest.mark.parametrize("h0", [True, False], ids=["h0", "no_h0"])
def test_low_level_backward_runs_on_cuda(h0):
    x = make_inputs(T=64, H=1, HV=2, K=128, V=128, dtype=torch.bfloat16, device="cuda", h0=h0)
    do = torch.randn(1, 64, 2, 128, device="cuda", dtype=torch.bfloat16)
    grads = flashqla.chunk_gated_delta_rule_bwd(x["q"], x["k"], x["v"], x["g"], x["beta"], 0.1, x["initial_state"], do,
                                                None)
    for grad, name in zip(grads[:5], ("q", "k", "v", "g", "beta")):
        assert grad.is_cuda and grad.shape == x[name].shape and grad.dtype == x[name].dtype, name
        assert torch.isfinite(grad).all(), name
    if h0:
        assert grads[5].is_cuda and grads[5].dtype == torch.float32 and grads[5].shape == x["initial_state"].shape
    else:
        assert grads[5] is None


def test_mixed_devices_are_rejected():
    x = make_inputs(T=16, H=1, HV=1, K=16, V=16, device="cuda")
    with pytest.raises(ValueError, match="v is on cpu but q is on cuda"):
        flashqla.chunk_gated_delta_rule(**{**x, "v": x["v"].cpu()})


def test_fused_gate_on_cuda():
    x = make_inputs(T=256, H=1, HV=2, K=128, V=128, dtype=torch.bfloat16, device="cuda")
    raw = torch.randn(1, 256, 2, device="cuda")
    A_log, dt_bias = torch.randn(2, device="cuda"), torch.randn(2, device="cuda")
    o, _ = flashqla.chunk_gated_delta_rule(**{**x, "g": raw}, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    g = -A_log.exp() * F.softplus(raw + dt_bias)
    ref_o, _ = _oracle({**x, "g": g})
    assert rel_error(o, ref_o) <= 5e-3


@pytest.mark.fla
@pytest.mark.skipif(not HAS_FLA, reason="flash-linear-attention not installed")
def test_fla_backend_takes_only_the_fast_path_on_cuda():
    """FLA's dispatch runs flashqla for the fused kernel's shapes (bitwise what the direct
    call gives) and keeps the rest, with the reason."""
    pytest.importorskip("fla.ops.gated_delta_rule")
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_entry

    from flashqla import _library, fla_backend

    backend = fla_backend.fla_dispatch().registry._backends["flashqla"]
    x = make_inputs(T=200, H=1, HV=2, K=128, V=128, dtype=torch.bfloat16, device="cuda")
    ok, reason = backend.verify("chunk_gated_delta_rule", **x, output_final_state=True)
    if not _library.CUDA_FORWARD_BEATS_FLA:
        assert not ok and "not yet faster than FLA" in reason
        return
    assert ok, reason
    with torch.no_grad():
        o, ht = fla_entry(**x, output_final_state=True)
        ref_o, ref_ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    assert torch.equal(o, ref_o) and torch.equal(ht, ref_ht)
    small = make_inputs(T=200, H=1, HV=2, K=64, V=64, dtype=torch.bfloat16, device="cuda")
    ok, reason = backend.verify("chunk_gated_delta_rule", **small, output_final_state=True)
    assert not ok and "K = V = 128" in reason


# --------------------------------------------------------------------------------------
# the core's kernel choice on real CUDA tensors, and the FLA backend following it
# --------------------------------------------------------------------------------------


def _choice_cases():
    """(name, inputs, expected kernel, a fragment of the core's reason)."""
    bf16 = dict(H=2, HV=4, dtype=torch.bfloat16, device="cuda", T=256)
    base = make_inputs(K=128, V=128, **bf16)
    padded = torch.randn(1, 256, 2, 132, device="cuda", dtype=torch.bfloat16)[..., :128]  # rows 264 bytes apart
    offset = torch.randn(1 * 256 * 2 * 128 + 1, device="cuda", dtype=torch.bfloat16)[1:].view(1, 256, 2, 128)
    qkv = torch.randn(1, 256, 2 * 2 * 128 + 4 * 128, device="cuda", dtype=torch.bfloat16)
    conv = torch.randn(1, 2 * 2 * 128 + 4 * 128, 256, device="cuda", dtype=torch.bfloat16)  # [B, C, T]
    return [
        ("fused", base, "sm90_fused", ""),
        ("packed_qkv", {**base, "q": qkv[..., :256].view(1, 256, 2, 128), "k": qkv[..., 256:512].view(1, 256, 2, 128),
                        "v": qkv[..., 512:].view(1, 256, 4, 128)}, "sm90_fused", ""),
        # the binding copies a tensor whose last dimension is strided: its copy is aligned
        ("feature_strided_v", {**base, "v": conv.transpose(1, 2)[..., 512:].reshape(1, 256, 4, 128)}, "sm90_fused", ""),
        ("K_64", make_inputs(K=64, V=128, **bf16), "sm90_simple", "K = 64: the fused kernel needs K = V = 128"),
        ("fp32", make_inputs(K=128, V=128, **{**bf16, "dtype": torch.float32}), "sm90_simple",
         "q, k and v are float32"),
        ("padded_rows", {**base, "q": padded}, "sm90_simple", "q's head stride (132 elements, 264 bytes)"),
        ("unaligned_base", {**base, "k": offset}, "sm90_simple", "k's base address is not 16-byte aligned"),
    ]


@pytest.mark.parametrize("case", range(7), ids=["fused", "packed_qkv", "feature_strided_v", "K_64", "fp32",
                                                "padded_rows", "unaligned_base"])
def test_kernel_choice_on_cuda(case):
    name, x, kernel, reason = _choice_cases()[case]
    with torch.no_grad():
        choice = flashqla.kernel_choice(**x, output_final_state=True)
        assert choice.kernel == kernel, (name, choice)
        assert reason in choice.reason and (choice.reason == "") == (kernel == "sm90_fused"), (name, choice)
        flashqla.chunk_gated_delta_rule(**x, output_final_state=True)  # the call runs as chosen


# The backward each forward case takes: the tensor-core backward where q, k, v are bf16,
# K = V = 128 and their rows 16-byte aligned (the forward's own rules for those three
# inputs), the simple one otherwise; fp16 runs the fused forward but the simple backward.
_BACKWARD_KERNELS = {"fused": "sm90_tensor_core", "packed_qkv": "sm90_tensor_core",
                     "feature_strided_v": "sm90_tensor_core", "K_64": "sm90_simple", "fp32": "sm90_simple",
                     "padded_rows": "sm90_simple", "unaligned_base": "sm90_simple"}


@pytest.mark.parametrize("case", range(8), ids=["fused", "packed_qkv", "feature_strided_v", "K_64", "fp32",
                                                "padded_rows", "unaligned_base", "fp16"])
def test_backward_kernel_choice_on_cuda(case):
    if case < 7:
        name, x, _, _ = _choice_cases()[case]
        kernel = _BACKWARD_KERNELS[name]
    else:
        x = make_inputs(K=128, V=128, H=2, HV=4, dtype=torch.float16, device="cuda", T=256)
        name, kernel = "fp16", "sm90_simple"
    choice = flashqla.backward_kernel_choice(**x, output_final_state=True)
    assert isinstance(choice, flashqla.BackwardKernelChoice)
    assert choice.kernel == kernel, (name, choice)
    assert (choice.reason == "") == (kernel == "sm90_tensor_core"), (name, choice)
    if name == "fp16":
        assert "the tensor-core backward takes bfloat16" in choice.reason
    assert choice.workspace_bytes > 0  # both CUDA backwards keep their states in the workspace
    # the backward runs as chosen
    def floating(t):
        return isinstance(t, torch.Tensor) and t.is_floating_point()

    leaves = {n: t.detach().requires_grad_(True) if floating(t) else t for n, t in x.items()}
    o, ht = flashqla.chunk_gated_delta_rule(**leaves, output_final_state=True)
    (o.float().sum() + ht.sum()).backward()
    assert all(t.grad is not None for t in leaves.values() if floating(t))


@pytest.mark.fla
@pytest.mark.skipif(not HAS_FLA, reason="flash-linear-attention not installed")
@pytest.mark.parametrize("case", range(7), ids=["fused", "packed_qkv", "feature_strided_v", "K_64", "fp32",
                                                "padded_rows", "unaligned_base"])
def test_fla_backend_follows_the_kernel_choice(case, monkeypatch):
    """FLA's verifier takes exactly the calls the core gives the fused kernel and declines
    the others with the core's reason."""
    import flashqla.fla_backend as fb

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the FLA backend takes CUDA calls on sm_90 only")
    monkeypatch.setattr(flashqla._library, "CUDA_FORWARD_BEATS_FLA", True)
    fb.register()
    _, x, kernel, _ = _choice_cases()[case]
    with torch.no_grad():
        choice = flashqla.kernel_choice(**x)
        ok, why = fb._backend.verify("chunk_gated_delta_rule", **x)
    if kernel == "sm90_fused":
        assert (ok, why) == (True, None)
    else:
        assert ok is False and choice.reason in why


def test_kernel_choice_flags_guessed_lengths():
    """docs/perf.md's 27B TP2 pair (28672 + 4096 tokens, 24 value heads): without
    cu_seqlens_cpu the piece plan takes the lengths as equal and says so; with it, it plans
    for the real lengths, and the workspace the forward allocates is the choice's."""
    if torch.cuda.get_device_properties(0).multi_processor_count <= 48:
        pytest.skip("48 chains fill this GPU")
    x = make_inputs(cu_seqlens=[0, 28672, 32768], H=8, HV=24, K=128, V=128, dtype=torch.bfloat16, device="cuda",
                    h0=False)
    with torch.no_grad():
        guessed = flashqla.kernel_choice(**x)
        known = flashqla.kernel_choice(**x, cu_seqlens_cpu=x["cu_seqlens"].cpu())
    assert guessed.kernel == known.kernel == "sm90_fused"
    assert guessed.lengths_guessed and not known.lengths_guessed
    assert known.uses_pieces and known.workspace_bytes > 0
