"""flashqla as a backend of flash-linear-attention's own dispatch (FLA 0.5.x and 0.6.x).

Once registered, ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` — and every
model or layer that calls it — runs on flashqla whenever flashqla supports the call;
the verifier declines exactly what flashqla does not support (with the reason), and
FLA then falls through to its next backend or its own Triton kernels.

Registration is explicit (``flashqla.fla_backend.register()``) and also automatic
when ``flashqla`` is imported with FLA installed, unless ``FLASHQLA_FLA_BACKEND=0``.
FLA's switch for the registered backend is ``FLA_FLASHQLA=0``.

FLA moved its dispatch between releases, and both layouts are supported:
- 0.5.x: ``fla.ops.backends`` (``BaseBackend``) and a module-level registry,
  ``fla.ops.gated_delta_rule.backends.gdr_registry``;
- 0.6.x: ``fla.backends`` (``BaseBackend``, ``register``), backends registered per
  operation with ``@register('gated_delta_rule')``; one registry serves every function
  FLA dispatches under that name, and a backend answers only the functions it defines
  (here ``chunk_gated_delta_rule``).
FLA's ``FLA_DISABLE_BACKEND_DISPATCH=1`` bypasses its dispatch altogether, flashqla's
backend included.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Any, Callable, NamedTuple

import torch

from . import _library
from . import gated_delta_rule as _gdr

# Lower runs first in FLA's dispatch; QwenLM FlashQLA's backend has priority 3.
PRIORITY = 2
BACKEND_TYPE = "flashqla"

_backend = None


def _fla_parameters() -> list[str]:
    """Parameter names of the installed FLA's chunk_gated_delta_rule, in order (positional
    arguments a caller gives FLA are bound by FLA's order, which differs from flashqla's
    after ``cu_seqlens_cpu``)."""
    from fla.ops.gated_delta_rule import chunk as fla_chunk

    params = inspect.signature(fla_chunk.chunk_gated_delta_rule).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _bind(fla_params: list[str], args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    if len(args) > len(fla_params):
        raise TypeError(f"chunk_gated_delta_rule() takes {len(fla_params)} positional arguments but "
                        f"{len(args)} were given")
    bound = dict(zip(fla_params, args))
    for name, value in kwargs.items():
        if name in bound:
            raise TypeError(f"chunk_gated_delta_rule() got multiple values for argument '{name}'")
        bound[name] = value
    return bound


def _split(own_names: list[str], bound: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Named parameters of flashqla's function, and the rest (its **kwargs)."""
    named = {k: v for k, v in bound.items() if k in own_names}
    rest = {k: v for k, v in bound.items() if k not in named}
    return named, rest


def _cuda_refusal(choose: Callable[[], _gdr.KernelChoice], use_gate_in_kernel: bool,
                  capability: tuple[int, int], *, training: bool,
                  choose_backward: Callable[[], _gdr.BackwardKernelChoice] | None = None) -> str | None:
    """Why FLA's dispatch keeps a CUDA call that flashqla could compute (None: flashqla
    takes it). Policy only: which kernel runs the call, and how, is the core's answer
    (``choose()``: the C API's kernel choice for the call, ``flashqla.kernel_choice``),
    never re-derived here. flashqla takes only what it has been measured faster than FLA
    on: calls the fused sm_90a kernel runs, on an sm_90 GPU, with the gate computed
    outside (``benchmarks/results/h200.csv``) or fused as FLA's GatedDeltaNet passes it
    (``use_gate_in_kernel``: flashqla computes the gate in fp32 before its kernel;
    measured with ``bench_fwd.py --fused-gate``, docs/perf.md). Calls the simple kernel
    runs stay with FLA, whose kernels are faster there, with the core's reason; so do
    calls whose sequence-piece plan rests on lengths the host does not know (packed
    sequences without ``cu_seqlens_cpu``, few chains: the plan takes the lengths as
    equal, and on uneven pairs at 24 heads that was slower than FLA,
    ``bench_fwd.py --no-host-lengths``, docs/perf.md). Training calls (``training``:
    inputs that require gradients, under grad mode, so the backward runs too) stay with
    FLA unless flashqla's backward is measured faster than FLA's
    (``_library.CUDA_BACKWARD_BEATS_FLA``) and the tensor-core backward runs them
    (``choose_backward()``: the C API's backward kernel choice, ``flashqla.backward_kernel_choice``;
    the simple backward, fp32 on CUDA cores, is far slower than FLA's)."""
    if not _library.CUDA_FORWARD_BEATS_FLA:
        return ("its sm_90a forward is not yet faster than FLA's own kernels on every published shape "
                "(see flashqla's docs/perf.md)")
    if tuple(capability) != (9, 0):
        return f"its CUDA kernels are for sm_90 (H100/H200); this GPU is sm_{capability[0]}{capability[1]}"
    if training and not _library.CUDA_BACKWARD_BEATS_FLA:
        return ("these inputs require gradients and its sm_90a backward is not yet faster than FLA's on every "
                "published shape, so FLA keeps training calls (under torch.no_grad() the same call goes to "
                "flashqla; flashqla.chunk_gated_delta_rule, called directly, trains on CUDA)")
    choice = choose()
    if choice.kernel != "sm90_fused":
        return (f"its fast kernel does not run this call ({choice.reason}); FLA is faster than its "
                f"{choice.kernel} kernel")
    if training and choose_backward is not None:
        backward = choose_backward()
        if backward.kernel != "sm90_tensor_core":
            return (f"these inputs require gradients and its tensor-core backward does not run them "
                    f"({backward.reason}); FLA's backward is faster than its {backward.kernel} backward")
    if use_gate_in_kernel and not _library.CUDA_FUSED_GATE_BEATS_FLA:
        return "its fused-gate path (use_gate_in_kernel) is not faster than FLA's on every published shape"
    if choice.lengths_guessed:
        return ("without cu_seqlens_cpu it plans sequence pieces for these packed sequences as if their lengths "
                "were equal; pass cu_seqlens_cpu (a CPU copy of cu_seqlens)")
    return None


def _is_training_call(c: _gdr._Call, rest: dict[str, Any]) -> bool:
    """Whether autograd records the call (grad mode on and a differentiable input, the
    fused gate's A_log and dt_bias included, requires grad): its backward will run."""
    return _gdr._records_grad(c.q, c.k, c.v, c.g, c.beta, c.initial_state, rest.get("A_log"), rest.get("dt_bias"))


class _Dispatch(NamedTuple):
    """FLA's dispatch for ``gated_delta_rule``, whichever layout the installed FLA has."""

    layout: str             # "fla.backends" (0.6.x) or "fla.ops.backends" (0.5.x)
    base_backend: type      # FLA's BaseBackend
    registry: Any           # FLA's BackendRegistry of the gated_delta_rule operation (both
                            # layouts: ``register(backend)`` adds or replaces by backend_type)


def _fla_version() -> str:
    try:
        import fla

        return getattr(fla, "__version__", "?")
    except ImportError:
        return "not installed"


def fla_dispatch() -> _Dispatch:
    """FLA's gated_delta_rule dispatch. Raises ImportError when FLA is not installed and
    RuntimeError for an FLA whose dispatch is neither 0.5.x's nor 0.6.x's."""
    importlib.import_module("fla")
    try:
        api = importlib.import_module("fla.backends")
    except ImportError:
        api = None
    if api is not None and hasattr(api, "register") and hasattr(api, "BaseBackend"):
        # 0.6.x: importing the operation's backends module loads FLA's own backends
        # into the operation's registry (FLA does the same on first dispatch).
        importlib.import_module("fla.ops.gated_delta_rule.backends")
        registry = api._get_operation_registry("gated_delta_rule")
        return _Dispatch("fla.backends", api.BaseBackend, registry)
    try:
        from fla.ops.backends import BaseBackend
        from fla.ops.gated_delta_rule.backends import gdr_registry
    except ImportError as e:
        raise RuntimeError(f"flashqla.fla_backend supports FLA's dispatch of 0.5.x (fla.ops.backends) and 0.6.x "
                           f"(fla.backends); found FLA {_fla_version()} with neither") from e
    return _Dispatch("fla.ops.backends", BaseBackend, gdr_registry)


def _make_backend(BaseBackend):
    fla_params = _fla_parameters()
    # flashqla's own parameters, read once (a later wrapper around the function must
    # not change what the verifier understands).
    own = inspect.signature(_gdr.chunk_gated_delta_rule).parameters
    own_names = [name for name, p in own.items() if p.kind != inspect.Parameter.VAR_KEYWORD]
    defaults = {name: p.default for name, p in own.items() if p.default is not inspect.Parameter.empty}

    class FlashqlaBackend(BaseBackend):
        backend_type = BACKEND_TYPE
        package_name = "flashqla"
        env_var = "FLA_FLASHQLA"
        default_enable = True
        priority = PRIORITY

        def chunk_gated_delta_rule_verifier(self, *args, **kwargs):
            named, rest = _split(own_names, _bind(fla_params, args, kwargs))
            call = {**defaults, **named}
            if call["cp_context"] is not None:
                return False, ("flashqla declines: cp_context: context-parallel calls stay with FLA's own CP "
                               "kernels (flashqla.chunk_gated_delta_rule takes cp_context when called directly; "
                               "its context parallelism is not measured against FLA's)")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    c = _gdr._prepare(call["q"], call["k"], call["v"], call["g"], call["beta"], call["scale"],
                                      call["initial_state"], call["output_final_state"],
                                      call["use_qk_l2norm_in_kernel"], call["use_beta_sigmoid_in_kernel"],
                                      call["allow_neg_eigval"], call["state_v_first"], call["cu_seqlens"],
                                      call["cu_seqlens_cpu"], call["chunk_indices"], call["cp_context"], rest,
                                      resolve_gate=False)
                    # The core's kernel choice validates the call as the forward does (head sizes,
                    # dtypes, cu_seqlens contents readable on the host), so what the call would
                    # refuse is declined with the core's message; on CUDA it also says which
                    # kernel runs the call, which the policy reads.
                    if c.q.is_cuda:
                        refusal = _cuda_refusal(lambda: _gdr._kernel_choice(c),
                                                bool(rest.get("use_gate_in_kernel", False)),
                                                torch.cuda.get_device_capability(c.q.device),
                                                training=_is_training_call(c, rest),
                                                choose_backward=lambda: _gdr._backward_kernel_choice(c))
                    else:
                        _gdr._kernel_choice(c)
                        refusal = None
                except Exception as e:  # noqa: BLE001 - every refusal becomes FLA's "declined" reason
                    return False, f"flashqla declines: {type(e).__name__}: {e}"
            if refusal is not None:
                return False, f"flashqla declines: {refusal}"
            return True, None

        def chunk_gated_delta_rule(self, *args, **kwargs):
            named, rest = _split(own_names, _bind(fla_params, args, kwargs))
            return _gdr.chunk_gated_delta_rule(**named, **rest)

    return FlashqlaBackend()


def register() -> bool:
    """Registers flashqla with FLA's ``gated_delta_rule`` dispatch (idempotent), in
    either of FLA's dispatch layouts (0.5.x, 0.6.x).

    Returns True when registered. Raises ImportError when FLA is not installed and
    RuntimeError for an FLA whose dispatch this module does not know.
    """
    global _backend
    dispatch = fla_dispatch()
    if _backend is None or not isinstance(_backend, dispatch.base_backend):
        _backend = _make_backend(dispatch.base_backend)
    dispatch.registry.register(_backend)
    return True


def is_registered() -> bool:
    try:
        registry = fla_dispatch().registry
    except (ImportError, RuntimeError):
        return False
    return any(getattr(b, "backend_type", None) == BACKEND_TYPE for b in registered_backends(registry))


def registered_backends(registry=None) -> list:
    """The backends in FLA's gated_delta_rule registry (all of FLA's own and flashqla's)."""
    registry = fla_dispatch().registry if registry is None else registry
    backends = getattr(registry, "_backends", None)
    if isinstance(backends, dict):
        return list(backends.values())
    return list(backends or [])
