"""The FLA-compatible API: ``chunk_gated_delta_rule`` and its low-level entries.

``chunk_gated_delta_rule`` takes flash-linear-attention 0.5.x's arguments in FLA's
order with FLA's defaults, returns what FLA returns (``o`` in q's dtype, the final
state in fp32 or ``None``), and raises FLA's error types and messages for the inputs
FLA rejects. Where FLA accepts something flashqla does not compute, flashqla raises
``NotImplementedError`` naming it. Keyword arguments FLA does not know are accepted
and ignored, as FLA does (HF transformers passes its own, ``use_cache`` among them);
each is logged once at debug level on the ``flashqla`` logger. Inputs FLA would
fail on with an unrelated error (a list for ``cu_seqlens``, zero heads, a NaN scale)
raise ``TypeError`` / ``ValueError`` naming the argument.
"""

from __future__ import annotations

import logging
import math
import numbers
import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import torch
import torch.nn.functional as F

from . import _library, ops
from ._errors import call_op

_log = logging.getLogger("flashqla")
_ignored_keywords: set[str] = set()


@dataclass
class _Call:
    """A validated call, ready for the op."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    beta: torch.Tensor
    scale: float
    initial_state: Optional[torch.Tensor]
    output_final_state: bool
    state_v_first: bool
    use_qk_l2norm: bool
    beta_activation: int
    cu_seqlens: Optional[torch.Tensor]
    cu_seqlens_cpu: Optional[torch.Tensor]

    def op_args(self) -> tuple:
        """The arguments of the forward op (and of its kernel choice), in the op's order."""
        return (self.q, self.k, self.v, self.g, self.beta, self.scale, self.initial_state, self.cu_seqlens,
                self.cu_seqlens_cpu, self.output_final_state, self.state_v_first, self.use_qk_l2norm,
                self.beta_activation)

    def bwd_choice_args(self) -> tuple:
        """The arguments of the backward's kernel choice op, in the op's order."""
        return (self.q, self.k, self.v, self.g, self.beta, self.scale, self.initial_state, self.cu_seqlens,
                self.cu_seqlens_cpu, self.state_v_first, self.use_qk_l2norm, self.beta_activation)


def _prepare(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
             use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens, cu_seqlens_cpu,
             chunk_indices, cp_context, kwargs: dict[str, Any], resolve_gate: bool = True) -> _Call:
    """Checks a call the way FLA does (same order, types and messages), then what
    flashqla additionally needs, and resolves defaults. Raises on anything invalid or
    unsupported; never mutates ``kwargs``. ``resolve_gate=False`` checks only (the
    fused-gate transform of g is skipped)."""
    kwargs = dict(kwargs)
    # --- what FLA's checks below assume (FLA fails on these with unrelated errors) ----
    _check_token_tensors(q, k, v)
    _check_cu_seqlens_type(cu_seqlens, cu_seqlens_cpu, q)
    # --- FLA's checks, in its order ---------------------------------------------------
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("Cannot pass both `state_v_first` and the deprecated `transpose_state_layout`.")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                      DeprecationWarning, stacklevel=3)
        state_v_first = kwargs.pop("transpose_state_layout")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k must have the same number of heads, but got q.shape[2]={q.shape[2]} "
                         f"and k.shape[2]={k.shape[2]}")
    H, HV = q.shape[2], v.shape[2]
    if HV % H != 0:
        raise ValueError(f"For GVA, num_v_heads (HV={HV}) must be evenly divisible by num_heads (H={H}), "
                         f"but got HV % H = {HV % H}")
    if "head_first" in kwargs:
        raise DeprecationWarning("head_first has been removed. Inputs must be in `[B, T, H, ...]` format.")
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"`chunk_size` must be 16, 32, or 64 for Gated Delta Rule, got {chunk_size}.")
    use_gate_in_kernel = kwargs.pop("use_gate_in_kernel", False)
    A_log = kwargs.pop("A_log", None)
    dt_bias = kwargs.pop("dt_bias", None)
    _ignore_unknown_keywords(kwargs)
    if cp_context is not None:
        # FLA takes the rank's local boundaries from the context (docs/context_parallel.md);
        # unlike FLA, flashqla refuses a different cu_seqlens argument rather than overriding it.
        from .context_parallel import _context_seqlens

        cu_seqlens, cu_seqlens_cpu = _context_seqlens(cp_context, cu_seqlens, cu_seqlens_cpu)
        _check_cu_seqlens_type(cu_seqlens, cu_seqlens_cpu, q)
    if cu_seqlens is not None:
        if q.shape[0] != 1:
            raise ValueError(f"The batch size is expected to be 1 rather than {q.shape[0]} when using "
                             f"`cu_seqlens`.Please flatten variable-length inputs before processing.")
        if initial_state is not None and initial_state.shape[0] != len(cu_seqlens) - 1:
            raise ValueError(f"The number of initial states is expected to be equal to the number of input "
                             f"sequences, i.e., {len(cu_seqlens) - 1} rather than {initial_state.shape[0]}.")
    if use_gate_in_kernel and A_log is None:
        raise AssertionError("A_log must be provided when use_gate_in_kernel=True.")  # FLA asserts here
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("`allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`.")
    if scale is None:
        scale = k.shape[-1] ** -0.5
    else:
        _check_scale(scale)

    # --- what flashqla needs beyond FLA's checks --------------------------------------
    B, T, _, K = q.shape
    V = v.shape[-1]
    if k.shape != q.shape:
        raise ValueError(f"flashqla: k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:2] != (B, T):
        raise ValueError(f"flashqla: v must be [B={B}, T={T}, HV, V], got {tuple(v.shape)}")
    for name, x in (("g", g), ("beta", beta)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"flashqla: {name} must be a torch.Tensor of shape [B, T, HV] = {[B, T, HV]}, "
                            f"got {type(x).__name__}")
        if tuple(x.shape) != (B, T, HV):
            raise ValueError(f"flashqla: {name} must have shape [B, T, HV] = {[B, T, HV]}, "
                             f"got {list(getattr(x, 'shape', []))}")
    # Head sizes and dtypes are the core's to judge (its validation, through the op or
    # kernel_choice); only what the op cannot see is checked here.
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if x.device != q.device:
            raise ValueError(f"flashqla: {name} is on {x.device} but q is on {q.device}")
    N = B if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor):
            raise TypeError(f"flashqla: initial_state must be a torch.Tensor or None, got "
                            f"{type(initial_state).__name__}")
        if initial_state.device != q.device:
            raise ValueError(f"flashqla: initial_state is on {initial_state.device} but q is on {q.device}")
        expected = (N, HV, V, K) if state_v_first else (N, HV, K, V)
        if tuple(initial_state.shape) != expected:
            raise ValueError(f"flashqla: initial_state must have shape {list(expected)} "
                             f"([N, HV, {'V, K' if state_v_first else 'K, V'}]), got {list(initial_state.shape)}")
        if not initial_state.dtype.is_floating_point:
            raise ValueError(f"flashqla: initial_state must be a float tensor, got {initial_state.dtype}")
    if cu_seqlens is not None:
        if cu_seqlens_cpu is not None:
            if cu_seqlens_cpu.device.type != "cpu" or cu_seqlens_cpu.shape != cu_seqlens.shape:
                raise ValueError(f"flashqla: cu_seqlens_cpu must be a CPU copy of cu_seqlens (same length "
                                 f"{cu_seqlens.shape[0]}), got {cu_seqlens_cpu.shape[0]} entries on "
                                 f"{cu_seqlens_cpu.device}")
            cu_seqlens_cpu = cu_seqlens_cpu.to(cu_seqlens.dtype).contiguous()
    else:
        cu_seqlens_cpu = None
    if q.is_cuda:
        if not _library.CUDA_FORWARD_AVAILABLE:
            raise NotImplementedError("flashqla: the sm_90a forward kernel is not part of this version")
        if not _library.CUDA_BACKWARD_AVAILABLE and _records_grad(q, k, v, g, beta, initial_state, A_log, dt_bias):
            raise NotImplementedError("flashqla: this build has no sm_90a backward kernel, and these CUDA inputs "
                                      "require gradients; run under torch.no_grad() or use CPU tensors")

    if use_gate_in_kernel:
        for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
            if x is not None and (not isinstance(x, torch.Tensor) or x.numel() != HV):
                raise ValueError(f"flashqla: {name} must be a tensor of HV = {HV} values (one a value head), "
                                 f"got {list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if use_gate_in_kernel and resolve_gate:
        # FLA's fused gate: g = -exp(A_log) * softplus(g + dt_bias), in fp32.
        raw = g.float() if dt_bias is None else g.float() + dt_bias.float()
        g = -A_log.float().exp() * F.softplus(raw)
    return _Call(q, k, v, g, beta, float(scale), initial_state, bool(output_final_state), bool(state_v_first),
                 bool(use_qk_l2norm_in_kernel), _beta_activation(use_beta_sigmoid_in_kernel, allow_neg_eigval),
                 cu_seqlens, cu_seqlens_cpu)


def _records_grad(*inputs) -> bool:
    """Whether autograd records a call on these inputs (grad mode on and one of the
    tensors among them requires grad): a training call, whose backward will run."""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs)


def _check_token_tensors(q, k, v) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"flashqla: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"flashqla: {name} must be a 4-d tensor [B, T, heads, head_dim], "
                             f"got shape {list(x.shape)}")
    for name, x, heads, dim in (("q", q, "H", "K"), ("k", k, "H", "K"), ("v", v, "HV", "V")):
        if x.shape[2] < 1:
            raise ValueError(f"flashqla: {name} has no heads ({name}.shape[2] = {heads} = 0; "
                             f"shape {list(x.shape)})")
        if x.shape[3] < 1:
            raise ValueError(f"flashqla: {name} has head dim {dim} = 0 ({name}.shape[3]; "
                             f"shape {list(x.shape)})")
    if q.shape[0] < 1:
        raise ValueError(f"flashqla: q has batch size B = 0 (shape {list(q.shape)}); B must be >= 1")


def _check_cu_seqlens_type(cu_seqlens, cu_seqlens_cpu, q) -> None:
    for name, x in (("cu_seqlens", cu_seqlens), ("cu_seqlens_cpu", cu_seqlens_cpu)):
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"flashqla: {name} must be a 1-d int32/int64 torch.Tensor (N + 1 sequence "
                            f"boundaries) or None, got {type(x).__name__}; e.g. torch.tensor({name}, "
                            f"dtype=torch.int32, device=q.device)")
    if cu_seqlens is None:
        if cu_seqlens_cpu is not None:
            raise ValueError("flashqla: cu_seqlens_cpu is given without cu_seqlens (it is a CPU copy of it)")
        return
    if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"flashqla: cu_seqlens must be a 1-d int32/int64 tensor, got "
                         f"{cu_seqlens.dim()}-d {cu_seqlens.dtype}")
    if cu_seqlens.shape[0] < 2:
        raise ValueError(f"flashqla: cu_seqlens must hold N + 1 >= 2 sequence boundaries [0, ..., T], got "
                         f"{cu_seqlens.shape[0]} entr{'y' if cu_seqlens.shape[0] == 1 else 'ies'}")
    if cu_seqlens.device != q.device:
        raise ValueError(f"flashqla: cu_seqlens is on {cu_seqlens.device} but q is on {q.device} (a CPU copy "
                         f"of it goes in cu_seqlens_cpu)")


def _check_scale(scale) -> None:
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"flashqla: scale must be a float or None (K^-1/2), got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"flashqla: scale must be finite, got {scale}; pass None for the default K^-1/2")


def _ignore_unknown_keywords(kwargs: dict[str, Any]) -> None:
    """FLA accepts keyword arguments it does not know and ignores them; so does flashqla
    (callers such as HF transformers pass their own through). Each name is logged once
    (not while torch.compile traces: logging there would break the graph)."""
    if not kwargs or torch.compiler.is_compiling():
        return
    for name in kwargs:
        if name not in _ignored_keywords:
            _ignored_keywords.add(name)
            _log.debug("chunk_gated_delta_rule: ignoring keyword argument %r (FLA ignores it too)", name)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
    chunk_indices: Optional[torch.Tensor] = None,
    cp_context: Any = None,
    **kwargs: Any,
):
    r"""Gated delta rule, chunked; a drop-in for FLA's ``chunk_gated_delta_rule``.

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]`` with ``HV % H == 0``; value head
            ``hv`` reads q/k head ``hv // (HV // H)``.
        g: ``[B, T, HV]`` log decay per token (raw gate with ``use_gate_in_kernel``).
        beta: ``[B, T, HV]`` (logits with ``use_beta_sigmoid_in_kernel``).
        scale: output scale, ``K ** -0.5`` when ``None``.
        initial_state: ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_v_first``), any
            float dtype; N is B, or ``len(cu_seqlens) - 1`` with ``cu_seqlens``.
        output_final_state: also return the final state (fp32).
        use_qk_l2norm_in_kernel: l2-normalise q and k (``x * rsqrt(sum(x^2) + 1e-6)``).
        use_beta_sigmoid_in_kernel / allow_neg_eigval: beta is ``sigmoid(beta)`` /
            ``2 * sigmoid(beta)``.
        state_v_first: states are ``[.., V, K]``.
        cu_seqlens: ``[N + 1]`` int32/int64 boundaries of packed sequences (B must be 1).
        cu_seqlens_cpu: a CPU copy of ``cu_seqlens``; lets every check run without a sync,
            and on CUDA lets the sequence-piece plan (few sequence-head chains) see the
            real lengths: without it the plan takes them as equal, which is up to 1.9x
            slower on very uneven batches (docs/perf.md).
        chunk_indices: accepted for compatibility and unused (flashqla plans on the device).
        cp_context: FLA's ``FLACPContext`` (any object with its attributes; layouts
            ``'contiguous'`` and ``'zigzag'``): this rank's shard of a packed batch split
            across ``cp_context.group``, q ``[1, T_local, H, K]`` with the context's local
            ``cu_seqlens`` (a ``cu_seqlens`` argument must be None or the same). o is the
            shard's, exact as one process; autograd gives each rank its shard's gradients.
            Beyond FLA (which asserts ``initial_state is None`` and no final state under
            CP): ``initial_state`` ``[N_local, HV, K, V]``, row i the initial state of local
            sequence i (ignored, gradient zero, where that sequence continues from the
            previous rank); the final state ``[N_local, HV, K, V]``, row i the state after
            sequence i's last token on this rank (its final state where it ends here, the
            state handed on where it goes on). Host syncs: the local boundaries are read
            on the host (the context's ``cu_seqlens_cpu``, else a device-to-host copy of
            its ``cu_seqlens``), and the ranks' piece flags, all-gathered, are read on the
            host once a forward (docs/context_parallel.md). Not traceable by
            ``torch.compile``.
        **kwargs: FLA's ``chunk_size`` (16/32/64; results do not depend on it),
            ``use_gate_in_kernel`` with ``A_log`` / ``dt_bias``
            (``g := -exp(A_log) * softplus(g + dt_bias)``), the deprecated
            ``transpose_state_layout``. Anything else is ignored, as FLA ignores it.

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` in q's dtype; final_state fp32 (fp64 for
        fp64 inputs) or ``None``.
    """
    c = _prepare(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                 use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens, cu_seqlens_cpu,
                 chunk_indices, cp_context, kwargs)
    if cp_context is not None:
        from .context_parallel import _chunk_with_cp_context

        return _chunk_with_cp_context(c, cp_context)
    o, final_state = call_op(ops.gdn_fwd, *c.op_args())
    return o, (final_state if c.output_final_state else None)


class KernelChoice(NamedTuple):
    """What flashqla's forward runs for a call: the C API's ``flashqla_gdn_fwd_kernel_choice``
    over the tensors the forward op would hand it."""

    kernel: str            # "cpu_chunked", "cpu_recurrent", "sm90_fused" (the fast one), "sm90_simple"
    pieces: str            # sequence pieces of the fused kernel: "none", "passes" or "chained"
    piece_chunks: int      # 64-token chunks a piece (0: whole sequences)
    lengths_guessed: bool  # the plan took packed sequences' lengths as equal (no cu_seqlens_cpu)
    workspace_bytes: int   # the workspace the forward allocates
    reason: str            # why not the fused kernel ("" when it runs)

    @property
    def uses_pieces(self) -> bool:
        return self.pieces != "none"


@torch.compiler.disable
def _kernel_choice(c: _Call) -> KernelChoice:
    """The kernel choice of a prepared call (the forward's own arguments, so the binding
    judges the tensors it would hand the kernel). Never traced: it reads pointers."""
    return KernelChoice(*call_op(ops.gdn_fwd_kernel_choice, *c.op_args()))


class BackwardKernelChoice(NamedTuple):
    """What flashqla's backward runs after a forward call: the C API's
    ``flashqla_gdn_bwd_kernel_choice`` over the tensors the backward op would hand it."""

    kernel: str           # "cpu_chunked", "cpu_recurrent", "sm90_tensor_core" (the fast one), "sm90_simple"
    piece_chunks: int     # the tensor-core chains' sequence pieces: 64-token chunks a piece (0: whole sequences)
    workspace_bytes: int  # the workspace the backward allocates
    reason: str           # why not the tensor-core backward ("" when it runs)


@torch.compiler.disable
def _backward_kernel_choice(c: _Call) -> BackwardKernelChoice:
    """The backward's kernel choice after a prepared forward call (do and the gradients
    taken as the fresh contiguous tensors autograd and the op give). Never traced."""
    return BackwardKernelChoice(*call_op(ops.gdn_bwd_kernel_choice, *c.bwd_choice_args()))


def backward_kernel_choice(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
    chunk_indices: Optional[torch.Tensor] = None,
    cp_context: Any = None,
    **kwargs: Any,
) -> BackwardKernelChoice:
    """Which kernel the backward of ``chunk_gated_delta_rule`` with these arguments runs,
    and why not the tensor-core sm_90a backward when it does not (the core's own rules:
    bf16, K = V = 128, 16-byte aligned rows of q, k, v and the incoming gradient, which
    is taken as autograd hands it over: fresh and contiguous). Same arguments as
    ``chunk_gated_delta_rule``; raises what it would raise on invalid or unsupported
    input. Computes nothing, copies nothing and never synchronises (with ``cp_context``:
    the choice for this rank's shard, as ``kernel_choice``)."""
    c = _prepare(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                 use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens, cu_seqlens_cpu,
                 chunk_indices, cp_context, kwargs, resolve_gate=False)
    return _backward_kernel_choice(c)


def kernel_choice(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    cu_seqlens_cpu: Optional[torch.Tensor] = None,
    chunk_indices: Optional[torch.Tensor] = None,
    cp_context: Any = None,
    **kwargs: Any,
) -> KernelChoice:
    """Which kernel ``chunk_gated_delta_rule`` with these arguments runs, and why not the
    fused sm_90a kernel when it does not (the core's own rules: head sizes, dtypes,
    alignment and strides of the tensors as the call would pass them, the sequence-piece
    plan). Same arguments as ``chunk_gated_delta_rule``; raises what it would raise on
    invalid or unsupported input. Computes nothing, copies nothing and never synchronises
    (with FLA's fused gate the raw gate stands for the computed one: the choice does not
    depend on it). With ``cp_context``: the choice for this rank's shard and local
    boundaries (reading them on the host where the context has no ``cu_seqlens_cpu``)."""
    c = _prepare(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                 use_beta_sigmoid_in_kernel, allow_neg_eigval, state_v_first, cu_seqlens, cu_seqlens_cpu,
                 chunk_indices, cp_context, kwargs, resolve_gate=False)
    return _kernel_choice(c)


def _beta_activation(use_beta_sigmoid_in_kernel: bool, allow_neg_eigval: bool) -> int:
    if allow_neg_eigval:
        return ops.BETA_SIGMOID_X2
    return ops.BETA_SIGMOID if use_beta_sigmoid_in_kernel else ops.BETA_IDENTITY


def chunk_gated_delta_rule_fwd(q, k, v, g, beta, scale: float, initial_state, output_final_state: bool,
                               state_v_first: bool = False, cu_seqlens=None, cu_seqlens_cpu=None,
                               use_qk_l2norm_in_kernel: bool = False, use_beta_sigmoid_in_kernel: bool = False,
                               allow_neg_eigval: bool = False):
    """Low-level forward (no autograd bookkeeping beyond the op's own).

    Returns ``(o, final_state)``; final_state is ``None`` unless ``output_final_state``.
    The backward needs nothing from it: ``chunk_gated_delta_rule_bwd`` takes the same
    inputs and recomputes the states.
    """
    _check_scale(scale)
    o, final_state = call_op(ops.gdn_fwd, q, k, v, g, beta, float(scale), initial_state, cu_seqlens,
                             cu_seqlens_cpu, bool(output_final_state), bool(state_v_first),
                             bool(use_qk_l2norm_in_kernel),
                             _beta_activation(use_beta_sigmoid_in_kernel, allow_neg_eigval))
    return o, (final_state if output_final_state else None)


def chunk_gated_delta_rule_bwd(q, k, v, g, beta, scale: float, initial_state, do, dht,
                               state_v_first: bool = False, cu_seqlens=None, cu_seqlens_cpu=None,
                               use_qk_l2norm_in_kernel: bool = False, use_beta_sigmoid_in_kernel: bool = False,
                               allow_neg_eigval: bool = False):
    """Low-level backward from the forward's inputs, ``do`` and an optional ``dht``.

    Returns ``(dq, dk, dv, dg, dbeta, dh0)``: dq/dk w.r.t. the raw q/k (through the
    l2norm when enabled, dk summed over each GQA group), dg w.r.t. the raw per-token g,
    dbeta w.r.t. the raw beta (through the sigmoid when enabled), dh0 fp32 (fp64 for fp64
    inputs) or ``None`` without an initial state.
    """
    _check_scale(scale)
    dq, dk, dv, dg, dbeta, dh0 = call_op(
        ops.gdn_bwd, q, k, v, g, beta, float(scale), initial_state, cu_seqlens, cu_seqlens_cpu, do, dht,
        bool(state_v_first), bool(use_qk_l2norm_in_kernel),
        _beta_activation(use_beta_sigmoid_in_kernel, allow_neg_eigval))
    return dq, dk, dv, dg, dbeta, (dh0 if initial_state is not None else None)
