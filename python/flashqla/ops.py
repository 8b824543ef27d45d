"""Fake (meta) implementations and autograd for the ops the binding registers.

``torch.ops.flashqla.gdn_fwd(q, k, v, g, beta, scale, initial_state, cu_seqlens,
cu_seqlens_cpu, output_final_state, state_v_first, use_qk_l2norm, beta_activation)
-> (o, final_state)``, ``torch.ops.flashqla.gdn_bwd(...) -> (dq, dk, dv, dg, dbeta,
dh0)`` and ``torch.ops.flashqla.gdn_fwd_kernel_choice`` (the forward's arguments ->
what it runs) are defined in C++ (``binding/torch/gdn_ops.cpp``). This module adds only what
torch.compile and autograd need: output shapes for fake tensors, and the backward
formula (which is the ``gdn_bwd`` op itself: it recomputes the states from the inputs).
"""

from __future__ import annotations

import torch

from . import _library  # noqa: F401  (registers the ops)
from ._errors import call_op

# Values of the binding's ``beta_activation`` argument (flashqla_beta_activation_t).
BETA_IDENTITY = 0
BETA_SIGMOID = 1
BETA_SIGMOID_X2 = 2

gdn_fwd = torch.ops.flashqla.gdn_fwd.default
# (q, k, v, g, beta, scale, state_pool!, state_indices, cu_seqlens, cu_seqlens_cpu, o!, write_back,
# state_v_first, use_qk_l2norm, beta_activation, checkpoints!?, checkpoint_chunks) -> (): the serving
# entry (flashqla/serving.py).
gdn_fwd_pooled = torch.ops.flashqla.gdn_fwd_pooled.default
gdn_bwd = torch.ops.flashqla.gdn_bwd.default
# (q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu, output_final_state,
# state_v_first, use_qk_l2norm, beta_activation) -> (kernel, pieces, piece_chunks,
# lengths_guessed, workspace_bytes, reason): what gdn_fwd with the same arguments runs, from
# the C API's flashqla_gdn_fwd_kernel_choice (computes, copies and synchronises nothing).
gdn_fwd_kernel_choice = torch.ops.flashqla.gdn_fwd_kernel_choice.default
# (q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu, state_v_first,
# use_qk_l2norm, beta_activation) -> (kernel, piece_chunks, workspace_bytes, reason): what gdn_bwd after that
# forward runs (do and the gradients fresh), from the C API's flashqla_gdn_bwd_kernel_choice.
gdn_bwd_kernel_choice = torch.ops.flashqla.gdn_bwd_kernel_choice.default


def _state_shape(q, v, n, state_v_first):
    K, HV, V = q.shape[-1], v.shape[2], v.shape[-1]
    return (n, HV, V, K) if state_v_first else (n, HV, K, V)


def _state_dtype(q):
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _num_sequences(q, cu_seqlens):
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


@torch.library.register_fake("flashqla::gdn_fwd")
def _gdn_fwd_fake(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu,
                  output_final_state, state_v_first, use_qk_l2norm, beta_activation):
    B, T, HV, V = v.shape
    o = q.new_empty((B, T, HV, V))
    shape = _state_shape(q, v, _num_sequences(q, cu_seqlens), state_v_first) if output_final_state else (0,)
    return o, q.new_empty(shape, dtype=_state_dtype(q))


@torch.library.register_fake("flashqla::gdn_fwd_pooled")
def _gdn_fwd_pooled_fake(q, k, v, g, beta, scale, state_pool, state_indices, cu_seqlens, cu_seqlens_cpu, o,
                         write_back, state_v_first, use_qk_l2norm, beta_activation, checkpoints, checkpoint_chunks):
    return None  # writes state_pool, o and checkpoints in place (the schema's (a!), (b!), (c!))


@torch.library.register_fake("flashqla::gdn_bwd")
def _gdn_bwd_fake(q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu, do, dht,
                  state_v_first, use_qk_l2norm, beta_activation):
    dh0_shape = (0,) if initial_state is None else _state_shape(q, v, initial_state.shape[0], state_v_first)
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format),
            torch.empty_like(g, memory_format=torch.contiguous_format),
            torch.empty_like(beta, memory_format=torch.contiguous_format),
            q.new_empty(dh0_shape, dtype=_state_dtype(q)))


def _setup_context(ctx, inputs, output):
    (q, k, v, g, beta, scale, initial_state, cu_seqlens, cu_seqlens_cpu,
     output_final_state, state_v_first, use_qk_l2norm, beta_activation) = inputs
    ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu)
    ctx.scale = scale
    ctx.state_v_first = state_v_first
    ctx.use_qk_l2norm = use_qk_l2norm
    ctx.beta_activation = beta_activation


def _backward(ctx, do, dht):
    q, k, v, g, beta, initial_state, cu_seqlens, cu_seqlens_cpu = ctx.saved_tensors
    if dht is not None and dht.numel() == 0:
        dht = None  # final_state was not requested: the 0-element placeholder has no gradient
    dq, dk, dv, dg, dbeta, dh0 = call_op(
        gdn_bwd, q, k, v, g, beta, ctx.scale, initial_state, cu_seqlens, cu_seqlens_cpu, do,
        dht, ctx.state_v_first, ctx.use_qk_l2norm, ctx.beta_activation)
    dh0 = None if initial_state is None else dh0.to(initial_state.dtype)
    return dq, dk, dv, dg, dbeta, None, dh0, None, None, None, None, None, None


# The backward is not itself differentiable: a second-order backward must fail loudly
# rather than return zeros.
torch.library.register_autograd("flashqla::gdn_fwd", torch.autograd.function.once_differentiable(_backward),
                                setup_context=_setup_context)
