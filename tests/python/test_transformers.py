"""flashqla inside HF transformers: a tiny random Qwen3-Next (``Qwen3NextConfig``, no
download) with flashqla in place of transformers' GDN kernel, and the same model
reaching flashqla through FLA's dispatch when FLA is installed.

transformers calls its GDN kernels through two module-level names of
``modeling_qwen3_next``, ``torch_chunk_gated_delta_rule`` (prefill) and
``torch_recurrent_gated_delta_rule`` (one-token decode), bound at import to FLA's
kernels where FLA is installed and to its own torch code otherwise; it passes its own
keyword arguments through (``use_cache``, ``output_router_logits``), which FLA — and
so flashqla — ignores. Each test binds those names to the kernel it studies:

- ``flashqla``: flashqla.chunk_gated_delta_rule for both (it takes one-token calls too);
- ``fp64``: the per-token recurrence in fp64 (tests/python/conftest.py), the reference
  for fp32 runs (DESIGN.md §5: on a GPU transformers' own fp32 path is about 1e-3 from
  fp64, flashqla's about 1e-7, so fp32 runs are judged against fp64);
- ``transformers``: transformers' own torch code, the reference for bf16 runs.

CPU (CI): forward, generate and a training step. GPU: forward and generate (the CUDA
backward is checked in test_gpu_backward.py). Through FLA's dispatch: the module's
names as transformers bound them; flashqla must be what ran (counted).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect

import pytest
import torch

transformers = pytest.importorskip("transformers")

import flashqla  # noqa: E402  (also registers the FLA backend where FLA is installed)
from conftest import HAS_CUDA, gdn_reference, rel_error  # noqa: E402

modeling = importlib.import_module("transformers.models.qwen3_next.modeling_qwen3_next")
gdr_module = importlib.import_module("flashqla.gated_delta_rule")

pytestmark = pytest.mark.transformers

HAS_FLA = importlib.util.find_spec("fla") is not None
gpu_param = pytest.param("cuda", marks=pytest.mark.gpu)
DEVICE_PARAMS = ["cpu"] + ([gpu_param] if HAS_CUDA else [])

# transformers' own torch code under the names it decorates (the decorator keeps it as
# __wrapped__ whatever implementation it bound).
TRANSFORMERS_CHUNK = inspect.unwrap(modeling.torch_chunk_gated_delta_rule)
TRANSFORMERS_RECURRENT = inspect.unwrap(modeling.torch_recurrent_gated_delta_rule)
AS_BOUND_CHUNK = modeling.torch_chunk_gated_delta_rule
AS_BOUND_RECURRENT = modeling.torch_recurrent_gated_delta_rule


def tiny_config(**over):
    """Two layers, GDN then full attention, with the product's head size (K = V = 128:
    on an H100/H200 FLA's dispatch hands exactly such calls to flashqla). Dense MLPs
    (mlp_only_layers): the MoE router's top-k flips under bf16 rounding and would
    make the bf16 comparisons measure the router, not the GDN kernel."""
    cfg = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=1, head_dim=32,
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=128,
               linear_value_head_dim=128, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=1,
               layer_types=["linear_attention", "full_attention"], mlp_only_layers=[0, 1],
               max_position_embeddings=512,
               initializer_range=0.1)
    cfg.update(over)
    return transformers.Qwen3NextConfig(**cfg)


def tiny_model(dtype=torch.float32, device="cpu", seed=0):
    torch.manual_seed(seed)
    model = transformers.Qwen3NextForCausalLM(tiny_config()).to(device=device, dtype=dtype)
    return model.eval()


def token_ids(device, B=2, T=100, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (B, T), generator=gen).to(device)


def fp64_kernel(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                use_qk_l2norm_in_kernel=False, cu_seqlens=None, **_):
    """FLA's calling convention over the fp64 per-token recurrence; outputs in the
    caller's dtypes (o in q's, the state in fp32). Differentiable."""
    o, ht = gdn_reference(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                          use_qk_l2norm=use_qk_l2norm_in_kernel)
    return o.to(q.dtype), (ht.float() if output_final_state else None)


class Counted:
    """A kernel that counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


def bind(monkeypatch, chunk, recurrent):
    """Binds transformers' two GDN kernel names; returns the counted kernels."""
    chunk, recurrent = Counted(chunk), Counted(recurrent)
    monkeypatch.setattr(modeling, "torch_chunk_gated_delta_rule", chunk)
    monkeypatch.setattr(modeling, "torch_recurrent_gated_delta_rule", recurrent)
    return chunk, recurrent


@pytest.fixture
def flashqla_calls(monkeypatch):
    """Counts calls that reach flashqla's function through its module attribute (the
    one FLA's dispatch backend calls)."""
    original = gdr_module.chunk_gated_delta_rule
    counted = Counted(original)
    wrapper = functools.wraps(original)(lambda *a, **kw: counted(*a, **kw))  # keeps the signature
    monkeypatch.setattr(gdr_module, "chunk_gated_delta_rule", wrapper)
    return counted


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.float()


def greedy(model, ids, new_tokens=8):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1]:]


# --------------------------------------------------------------------------------------
# flashqla in place of transformers' kernel
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_fp32_forward_matches_fp64_reference(monkeypatch, device):
    model, ids = tiny_model(device=device), token_ids(device)
    chunk, _ = bind(monkeypatch, fp64_kernel, fp64_kernel)
    ref = logits(model, ids)
    assert chunk.calls == 1
    chunk, _ = bind(monkeypatch, flashqla.chunk_gated_delta_rule, flashqla.chunk_gated_delta_rule)
    ours = logits(model, ids)
    assert chunk.calls == 1
    assert rel_error(ours, ref) < 1e-5


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_fp32_generate_matches_fp64_reference(monkeypatch, device):
    model, ids = tiny_model(device=device), token_ids(device, T=40)
    bind(monkeypatch, fp64_kernel, fp64_kernel)
    ref = greedy(model, ids)
    chunk, recurrent = bind(monkeypatch, flashqla.chunk_gated_delta_rule, flashqla.chunk_gated_delta_rule)
    ours = greedy(model, ids)
    assert chunk.calls == 1 and recurrent.calls == ours.shape[1] - 1  # prefill, then one call a new token
    assert torch.equal(ours, ref), (ours, ref)


def assert_within_bf16_noise(ours, theirs, exact):
    """bf16 logits of a model with flashqla against the same bf16 model with
    transformers' own kernel: no farther apart than bf16 puts transformers' path from
    the exact (fp32 weights, fp64 kernel) model, and as close to that model."""
    noise = rel_error(theirs, exact)
    assert noise < 5e-2, f"transformers' own bf16 path is {noise:.1e} from the exact model"
    assert rel_error(ours, theirs) <= noise, (rel_error(ours, theirs), noise)
    assert rel_error(ours, exact) <= 1.25 * noise + 1e-3, (rel_error(ours, exact), noise)


def exact_logits(monkeypatch, device, ids):
    bind(monkeypatch, fp64_kernel, fp64_kernel)
    return logits(tiny_model(device=device), ids)


@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_bf16_matches_transformers_path(monkeypatch, device):
    """A bf16 model against transformers' own path on the same model: logits within bf16
    noise (assert_within_bf16_noise) and the same greedy tokens."""
    ids = token_ids(device)
    exact = exact_logits(monkeypatch, device, ids)
    model = tiny_model(dtype=torch.bfloat16, device=device)
    bind(monkeypatch, TRANSFORMERS_CHUNK, TRANSFORMERS_RECURRENT)
    theirs, theirs_tokens = logits(model, ids), greedy(model, ids[:, :40])
    chunk, recurrent = bind(monkeypatch, flashqla.chunk_gated_delta_rule, flashqla.chunk_gated_delta_rule)
    ours, ours_tokens = logits(model, ids), greedy(model, ids[:, :40])
    assert chunk.calls == 2 and recurrent.calls == ours_tokens.shape[1] - 1
    assert_within_bf16_noise(ours, theirs, exact)
    assert torch.equal(ours_tokens, theirs_tokens), (ours_tokens, theirs_tokens)


def test_training_step_matches_fp64_reference(monkeypatch):
    """CPU: the loss and every parameter's gradient through flashqla's backward match the
    fp64 kernel's, and an optimizer step through it trains (the loss goes down)."""
    ids = token_ids("cpu", T=64)

    def step(kernel):
        model = tiny_model().train()
        chunk, _ = bind(monkeypatch, kernel, kernel)
        loss = model(ids, labels=ids).loss
        loss.backward()
        assert chunk.calls == 1
        return model, loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    _, ref_loss, ref_grads = step(fp64_kernel)
    model, loss, grads = step(flashqla.chunk_gated_delta_rule)
    assert abs(loss.item() - ref_loss.item()) <= 1e-6 * abs(ref_loss.item())
    assert grads.keys() == ref_grads.keys()
    gdn = [n for n in grads if ".linear_attn." in n]
    assert {n.rsplit(".", 1)[-1] for n in gdn} >= {"A_log", "dt_bias", "weight"}
    for name in grads:
        assert rel_error(grads[name], ref_grads[name]) < 1e-5, name

    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt.step()
    with torch.no_grad():
        after = model(ids, labels=ids).loss
    assert torch.isfinite(after) and after < loss


# --------------------------------------------------------------------------------------
# through FLA's dispatch (FLA installed): transformers binds FLA's kernels, FLA's
# dispatch hands the prefill to flashqla
# --------------------------------------------------------------------------------------

needs_fla = pytest.mark.skipif(not HAS_FLA, reason="flash-linear-attention not installed")


@needs_fla
def test_transformers_bound_fla():
    fla_gdr = importlib.import_module("fla.ops.gated_delta_rule")
    probe = inspect.getclosurevars(AS_BOUND_CHUNK).nonlocals.get("implementation")
    assert probe is fla_gdr.chunk_gated_delta_rule


@needs_fla
@pytest.mark.fla
@pytest.mark.parametrize("device", DEVICE_PARAMS)
def test_through_fla_dispatch(monkeypatch, flashqla_calls, device):
    """fp32 on the CPU (against fp64), bf16 on the GPU (FLA's dispatch hands flashqla
    the calls its fused kernel runs: bf16/fp16, K = V = 128; against transformers' path).
    One-token decode stays with FLA's fused_recurrent kernel on the GPU (Triton); on the
    CPU, where Triton does not run, with transformers' torch code."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    ids = token_ids(device)
    exact = exact_logits(monkeypatch, device, ids) if device == "cuda" else None
    model = tiny_model(dtype=dtype, device=device)
    recurrent = AS_BOUND_RECURRENT if device == "cuda" else TRANSFORMERS_RECURRENT
    bind(monkeypatch, AS_BOUND_CHUNK, recurrent)
    ours = logits(model, ids)
    assert flashqla_calls.calls == 1, "FLA's dispatch did not run flashqla"
    tokens = greedy(model, ids[:, :40])
    assert flashqla_calls.calls == 2

    if device == "cpu":
        bind(monkeypatch, fp64_kernel, fp64_kernel)
        assert rel_error(ours, logits(model, ids)) < 1e-5
        assert torch.equal(tokens, greedy(model, ids[:, :40]))
    else:
        bind(monkeypatch, TRANSFORMERS_CHUNK, TRANSFORMERS_RECURRENT)
        assert_within_bf16_noise(ours, logits(model, ids), exact)
        assert torch.equal(tokens, greedy(model, ids[:, :40]))


@needs_fla
@pytest.mark.fla
def test_training_step_through_fla_dispatch(monkeypatch, flashqla_calls):
    ids = token_ids("cpu", T=64)
    grads = {}
    for name, chunk in (("fla", AS_BOUND_CHUNK), ("fp64", fp64_kernel)):
        model = tiny_model().train()
        bind(monkeypatch, chunk, chunk)
        model(ids, labels=ids).loss.backward()
        grads[name] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert flashqla_calls.calls == 1
    for n in grads["fp64"]:
        assert rel_error(grads["fla"][n], grads["fp64"][n]) < 1e-5, n
