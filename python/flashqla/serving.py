"""The serving entry: GDN prefill over a state pool, updated in place.

Engines keep every request's GDN state in one pool, ``[slots, HV, K, V]`` (or, V-first,
``[slots, HV, V, K]``), fp32 or bf16, and know each sequence of a batch by its slot.
``chunk_gated_delta_rule_pooled`` reads sequence n's initial state from
``state_pool[state_indices[n]]`` and writes its final state back to that row, in place,
inside the kernels: no gather before the call, no scatter after it, no host sync, and a
CUDA graph captured once stays right when the indices and lengths change. A negative
index starts its sequence from zero and writes nothing.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import ops
from ._errors import call_op
from .gated_delta_rule import _prepare


def chunk_gated_delta_rule_pooled(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    scale: Optional[float] = None,
    cu_seqlens: Optional[torch.Tensor] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
    output: Optional[torch.Tensor] = None,
    write_final_state: bool = True,
    checkpoints: Optional[torch.Tensor] = None,
    checkpoint_chunks: int = 0,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    **kwargs,
) -> torch.Tensor:
    r"""GDN forward over a state pool (inference; no autograd).

    Args:
        q, k, v, g, beta, scale, cu_seqlens, cu_seqlens_cpu, use_qk_l2norm_in_kernel,
            use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first: as
            ``chunk_gated_delta_rule`` (FLA's fused gate too: ``use_gate_in_kernel=True,
            A_log=..., dt_bias=...``).
        state_pool: ``[slots, HV, K, V]`` (``[slots, HV, V, K]`` with ``state_v_first``),
            any float dtype, unit last stride; read at the sequences' slots and, with
            ``write_final_state``, written there in place.
        state_indices: ``[N]`` int32 or int64 on q's device, one slot a sequence (N =
            ``len(cu_seqlens) - 1``, else B); negative: start from zero, write nothing.
            The non-negative ones must be distinct and below ``slots`` (checked where the
            host can read them: CPU tensors; on CUDA an index past the pool is taken as
            negative).
        output: where o goes, ``[B, T, HV, V]``, unit last stride (default: a new tensor
            of q's dtype).
        checkpoints, checkpoint_chunks: prefix caching. With ``checkpoint_chunks = e > 0``
            each sequence's state after every ``64 e`` tokens goes to ``checkpoints``
            (``[rows, HV, K, V]``, or V-first, any float dtype, unit last stride, ``rows >=
            floor(B T / (64 e))``): sequence n's j-th checkpoint (after its first ``64 e j``
            tokens) at row ``sum_{m<n} floor(len_m / (64 e)) + j - 1``.

    Returns:
        o (``output`` when given).
    """
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                       for x in (q, k, v, g, beta, state_pool)):
        raise ValueError("flashqla: chunk_gated_delta_rule_pooled is inference only (no autograd through the "
                         "pool); call it under torch.no_grad() or torch.inference_mode()")
    c = _prepare(q, k, v, g, beta, scale, None, False, use_qk_l2norm_in_kernel, use_beta_sigmoid_in_kernel,
                 allow_neg_eigval, state_v_first, cu_seqlens, cu_seqlens_cpu, None, None, kwargs)
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if not isinstance(state_pool, torch.Tensor) or state_pool.dim() != 4:
        raise ValueError("flashqla: state_pool must be a 4-d tensor [slots, HV, K, V] ([slots, HV, V, K] with "
                         f"state_v_first), got {getattr(state_pool, 'shape', type(state_pool).__name__)}")
    row = (HV, V, K) if state_v_first else (HV, K, V)
    if tuple(state_pool.shape[1:]) != row or state_pool.shape[0] < 1:
        raise ValueError(f"flashqla: state_pool must have shape [slots >= 1, {', '.join(map(str, row))}], got "
                         f"{list(state_pool.shape)}")
    if not state_pool.dtype.is_floating_point or state_pool.device != q.device:
        raise ValueError(f"flashqla: state_pool must be a float tensor on {q.device}, got {state_pool.dtype} "
                         f"on {state_pool.device}")
    if state_pool.stride(-1) != 1:
        raise ValueError("flashqla: state_pool must have a unit last stride (it is updated in place)")
    if (not isinstance(state_indices, torch.Tensor) or state_indices.dtype not in (torch.int32, torch.int64)
            or tuple(state_indices.shape) != (N,) or state_indices.device != q.device):
        raise ValueError(f"flashqla: state_indices must be an int32/int64 tensor of shape [N = {N}] on "
                         f"{q.device}, got {getattr(state_indices, 'dtype', type(state_indices).__name__)} "
                         f"{list(getattr(state_indices, 'shape', []))}")
    if output is None:
        output = q.new_empty((B, T, HV, V))
    elif (not isinstance(output, torch.Tensor) or tuple(output.shape) != (B, T, HV, V)
          or output.device != q.device or not output.dtype.is_floating_point or output.stride(-1) != 1):
        raise ValueError(f"flashqla: output must be a float tensor [B, T, HV, V] = {[B, T, HV, V]} on {q.device} "
                         f"with a unit last stride, got {getattr(output, 'shape', type(output).__name__)}")
    if not isinstance(checkpoint_chunks, int) or checkpoint_chunks < 0:
        raise ValueError(f"flashqla: checkpoint_chunks must be an int >= 0 (0: no checkpoints), got {checkpoint_chunks!r}")
    if (checkpoints is None) != (checkpoint_chunks == 0):
        raise ValueError("flashqla: checkpoints and checkpoint_chunks > 0 go together")
    if checkpoints is not None:
        needed = B * T // (64 * checkpoint_chunks)
        if (not isinstance(checkpoints, torch.Tensor) or checkpoints.dim() != 4 or tuple(checkpoints.shape[1:]) != row
                or checkpoints.shape[0] < needed or checkpoints.device != q.device
                or not checkpoints.dtype.is_floating_point or checkpoints.stride(-1) != 1):
            raise ValueError(f"flashqla: checkpoints must be a float tensor [rows >= {needed}, "
                             f"{', '.join(map(str, row))}] on {q.device} with a unit last stride, got "
                             f"{getattr(checkpoints, 'shape', type(checkpoints).__name__)}")
    call_op(ops.gdn_fwd_pooled, c.q, c.k, c.v, c.g, c.beta, c.scale, state_pool, state_indices.contiguous(),
            c.cu_seqlens, c.cu_seqlens_cpu, output, bool(write_final_state), c.state_v_first, c.use_qk_l2norm,
            c.beta_activation, checkpoints, int(checkpoint_chunks))
    return output
