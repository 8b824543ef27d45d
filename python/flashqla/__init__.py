"""flashqla: Gated Delta Network attention (chunked prefill, forward and backward).

``flashqla.chunk_gated_delta_rule`` is a drop-in for flash-linear-attention's function
of the same name (same arguments, order, defaults and outputs), differentiable and
traceable by ``torch.compile``. With FLA installed, importing flashqla also registers
it as a backend of FLA's own dispatch (``FLASHQLA_FLA_BACKEND=0`` turns that off).
"""

from __future__ import annotations

import importlib.util as _importlib_util
import os as _os
import warnings as _warnings

from . import ops  # noqa: F401  (loads the binding, registers fake impls and autograd)
from .gated_delta_rule import (
    BackwardKernelChoice,
    KernelChoice,
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_bwd,
    chunk_gated_delta_rule_fwd,
    backward_kernel_choice,
    kernel_choice,
)
from .context_parallel import chunk_gated_delta_rule_cp
from .serving import chunk_gated_delta_rule_pooled

__version__ = "0.1.0"

__all__ = [
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_fwd",
    "chunk_gated_delta_rule_bwd",
    "chunk_gated_delta_rule_pooled",
    "chunk_gated_delta_rule_cp",
    "kernel_choice",
    "KernelChoice",
    "backward_kernel_choice",
    "BackwardKernelChoice",
    "__version__",
]


def _register_with_fla() -> None:
    if _os.environ.get("FLASHQLA_FLA_BACKEND", "1") == "0" or _importlib_util.find_spec("fla") is None:
        return
    from . import fla_backend

    try:
        fla_backend.register()
    except Exception as e:  # noqa: BLE001 - a broken FLA install must not break flashqla
        _warnings.warn(f"flashqla: not registered as an FLA backend: {type(e).__name__}: {e}", stacklevel=2)


_register_with_fla()
